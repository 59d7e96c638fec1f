// `cgn-agent` with no subcommand is a command line missing its command: README "Exit codes" promises one line on
// stderr pointing at --help, exit 1. It printed the whole help to stdout, nothing on stderr, and exited 1, so a
// script saw a failure with no word on stderr. Help asked for stays on stdout, exit 0. The binary from source.
import { describe, expect, it } from "vitest"
import { wizardWithoutTerminal } from "../../src/programs/cli.ts"
import { runCli } from "../support/cli.ts"

describe("cgn-agent with no subcommand", () => {
  it("one line on stderr naming the commands, pointing at --help; nothing on stdout; exit 1", async () => {
    const r = await runCli([])
    expect(r).toEqual({
      code: 1,
      stdout: "",
      stderr: "cgn-agent: a command is required: run, check, render, generate, help or version (see cgn-agent --help)\n"
    })
  })

  it("--help and `help` still print the help on stdout, exit 0, nothing on stderr", async () => {
    const [flag, word] = await Promise.all([runCli(["--help"]), runCli(["help"])])
    for (const r of [flag, word]) {
      expect(r.code).toBe(0)
      expect(r.stderr).toBe("")
      expect(r.stdout).toMatch(/^SUBCOMMANDS$/m)
    }
    expect(word.stdout).toBe(flag.stdout)
  })

  it("--wizard with no terminal on stdin: one line on stderr, exit 1, where the prompt ended at once with exit 0", async () => {
    const line =
      "cgn-agent: --wizard asks its questions on a terminal, and standard input is not one (see cgn-agent --help)\n"
    for (const args of [["--wizard"], ["run", "--wizard"]])
      expect(await runCli(args)).toEqual({ code: 1, stdout: "", stderr: line })
    // on a terminal the wizard runs as effect/cli has it; without --wizard nothing is refused
    expect(wizardWithoutTerminal(["--wizard"], true)).toBeUndefined()
    expect(wizardWithoutTerminal(["check"], false)).toBeUndefined()
  })
})
