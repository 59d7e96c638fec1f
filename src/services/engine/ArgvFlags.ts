/** Reading an engine's command line as its argument parser does (pure). */

/**
 * The last value of `flag` in argv (`--flag value` or `--flag=value`), or undefined when it is not given: argparse and
 * llama-server keep the last of a repeated flag, so an operator's `engine.args`, after the rendered ones, win. A list
 * names one option's spellings (llama-server's `-np` and `--parallel`): the last of any of them.
 */
export const lastFlagValue = (
  argv: ReadonlyArray<string>,
  flag: string | ReadonlyArray<string>
): string | undefined => {
  const flags = typeof flag === "string" ? [flag] : flag
  let value: string | undefined
  argv.forEach((arg, i) => {
    for (const f of flags) {
      if (arg === f) value = argv[i + 1] ?? ""
      else if (arg.startsWith(`${f}=`)) value = arg.slice(f.length + 1)
    }
  })
  return value
}

/**
 * Which of `flags` an argument sets as the engines' parsers read it: the flag it names exactly (up to `=`; vLLM's
 * FlexibleArgumentParser also reads `_` as `-`, vllm/utils/argparse_utils.py), else the one of them it is a prefix of
 * (argparse's allow_abbrev: SGLang reads `--api-ke` as `--api-key`); undefined when it names none.
 */
export const flagSetBy = (arg: string, flags: ReadonlyArray<string>): string | undefined => {
  if (!arg.startsWith("--")) return undefined
  const name = (arg.split("=", 1)[0] ?? arg).replaceAll("_", "-")
  if (flags.includes(name)) return name
  const prefixed = name.length > 2 ? flags.filter((f) => f.startsWith(name)) : []
  return prefixed.length === 1 ? prefixed[0] : undefined
}
