/** Reading an engine's command line as its argument parser does (pure). */

/**
 * The last value of `flag` in argv (`--flag value` or `--flag=value`), or undefined when it is not given: argparse and
 * llama-server keep the last of a repeated flag, so an operator's `engine.args`, after the rendered ones, win.
 */
export const lastFlagValue = (argv: ReadonlyArray<string>, flag: string): string | undefined => {
  let value: string | undefined
  argv.forEach((arg, i) => {
    if (arg === flag) value = argv[i + 1] ?? ""
    else if (arg.startsWith(`${flag}=`)) value = arg.slice(flag.length + 1)
  })
  return value
}
