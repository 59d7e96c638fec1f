// The chat template of the simulator's llama_cpp flavor (pure): ChatML, llama.cpp's own `chatml` and the one the
// tiny test model carries, as the simulator has no model of its own. One rule renders a chat for /apply-template and
// for a chat completion, whose prompt llama-server counts after the rendering (tools/server/server-common.cpp
// oaicompat_chat_params_parse: common_chat_templates_apply; then tools/server/server-context.cpp
// handle_completions_impl tokenizes the prompt with its BOS, tokenize_input_prompts(..., add_special = true, ...)):
// its usage.prompt_tokens, /slots n_prompt_tokens, `timings`, llamacpp:prompt_tokens_total and the context-size
// refusal all count the template's tokens. The tokens are the tiny model's tokenizer's (llama SentencePiece),
// measured against the real server with /tokenize (test/real/sim-differential-2.test.ts holds the counts to it): the
// template's own text a token per run of letters and per other sign, "assistant" two, a newline one (a byte token);
// the messages' words the simulator's, one each (tokens.ts).

/** The template's Jinja source, as /props shows it. */
export const CHAT_TEMPLATE =
  "{%- for message in messages -%}\n  {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' -}}\n{%- endfor -%}\n{%- if add_generation_prompt -%}\n  {{- '<|im_start|>assistant\n' -}}\n{%- endif -%}"

/** What the template adds for the answer to follow (a task's params.generation_prompt: llamaSlots.ts). */
export const GENERATION_PROMPT = "<|im_start|>assistant\n"

/** Words the tokenizer cuts apart (measured: "assistant" is "ass" "istant"). */
const CUTS: Readonly<Record<string, ReadonlyArray<string>>> = { assistant: ["ass", "istant"] }

/** The template's own text (its markers, a role) in tokens. */
const templateTokens = (text: string): Array<string> =>
  (text.match(/[A-Za-z]+|[^A-Za-z]/g) ?? []).flatMap((p) => CUTS[p] ?? [p])

/** A message's text in tokens: the simulator's words, each newline one more. */
const contentTokens = (text: string): Array<string> => text.match(/\n|[^\s]+/g) ?? []

/**
 * A message's text as the template sees it: a string, or its text parts joined by newlines (the template takes
 * strings only: common/chat.cpp messages_inp_normalizer::concat_content_parts); a continued assistant message's
 * parts by blank lines (`sep`; measured against the real server).
 */
const contentOf = (c: unknown, sep = "\n"): string =>
  typeof c === "string"
    ? c
    : Array.isArray(c)
      ? c.map((p) => (typeof p?.text === "string" ? (p.text as string) : "")).join(sep)
      : ""

/** A message's role as the template gets it: OpenAI's `developer` is the template's `system` (measured). */
const roleOf = (role: unknown): string => (role === "developer" ? "system" : String(role))

export interface ChatPrompt {
  /** The rendered prompt (/apply-template's `prompt`). */
  readonly text: string
  /** Its tokens, without the BOS the completion adds. */
  readonly tokens: ReadonlyArray<string>
}

interface Message {
  readonly role?: unknown
  readonly content?: unknown
}

/**
 * A chat rendered, the generation prompt after it unless `addGenerationPrompt` is false (the request's
 * add_generation_prompt). A trailing assistant message is continued (--prefill-assistant, on by default:
 * oaicompat_chat_params_parse sets continue_final_message): the messages before it are rendered, then, unless it is
 * empty, the generation prompt and its text, unclosed (common/chat-auto-parser-generator.cpp generate_parser;
 * common_chat_msg::empty). Measured: "hi" then an empty assistant message renders as "hi" alone, closed.
 */
export const renderChat = (messages: ReadonlyArray<Message>, addGenerationPrompt: boolean): ChatPrompt => {
  const last = messages.at(-1)
  const continued = last?.role === "assistant" ? last : undefined
  const parts: Array<[string, Array<string>]> = []
  for (const m of continued === undefined ? messages : messages.slice(0, -1)) {
    const [role, content] = [roleOf(m.role), contentOf(m.content)]
    parts.push([`<|im_start|>${role}\n`, templateTokens(`<|im_start|>${role}\n`)])
    parts.push([content, contentTokens(content)], ["<|im_end|>\n", templateTokens("<|im_end|>\n")])
  }
  const text = contentOf(continued?.content, "\n\n")
  if (continued === undefined ? addGenerationPrompt : text !== "") {
    parts.push([GENERATION_PROMPT, templateTokens(GENERATION_PROMPT)])
  }
  if (continued !== undefined) parts.push([text, contentTokens(text)])
  return { text: parts.map((p) => p[0]).join(""), tokens: parts.flatMap((p) => p[1]) }
}
