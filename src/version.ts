/** The release version both binaries print (`--version`, `version`); kept equal to package.json's (test/programs/cli.test.ts). */
export const VERSION = "0.1.0"
