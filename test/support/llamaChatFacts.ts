// What the real llama-server was measured to answer to a chat's own checks (the rest, /tokenize and /detokenize
// items, a slot's launch order, `verbose` and `return_progress` shapes: llamaLaunchFacts.ts). test/real/
// sim-differential-9.test.ts sends these to both it and the simulator; test/sim/llama-chat-checks.test.ts holds the
// simulator alone to them. Started as `-c 1024 -np 2` (a slot's context 512). Bodies go out through JSON.stringify.

export type FactPath = "/v1/chat/completions" | "/apply-template" | "/v1/completions" | "/tokenize" | "/detokenize"

export interface ChatFact {
  /** Which class of the fuzz's findings it stands for, and why it answers so. */
  readonly why: string
  readonly path: FactPath
  readonly body: Record<string, unknown>
  readonly status: number
  /** A refusal's message (its type: server_error for 500, else invalid_request_error). */
  readonly message?: string
  /** A taken request's whole body, where it does not depend on the model's sampling. */
  readonly answer?: unknown
}

/** The whole error body llama-server writes for a refusal. */
export const errorText = (status: number, message: string): string =>
  JSON.stringify({ error: { code: status, message, type: status === 500 ? "server_error" : "invalid_request_error" } })

const user = [{ role: "user", content: "a b" }]
const TOOL = { type: "function", function: { name: "f" } }
const CALL = { type: "function", function: { name: "f", arguments: "{}" } }
const UNABLE = "Unable to generate parser for this template. Automatic parser generation failed: "

/** A chat check's body (the user's message, max_tokens 2, and `extra`), the same on both chat routes. */
const both = (why: string, extra: Record<string, unknown>, status: number, message?: string): Array<ChatFact> =>
  (["/v1/chat/completions", "/apply-template"] as const).map((path) => ({
    why: `${why} (${path})`,
    path,
    body: { messages: user, max_tokens: 2, ...extra },
    status,
    ...(message === undefined ? {} : { message })
  }))

/** F6: oaicompat_chat_params_parse's checks, in its order, before any field of the schema. */
export const CHAT_CHECKS: ReadonlyArray<ChatFact> = [
  ...both(
    "tools is an array",
    { tools: 1 },
    500,
    "Failed to parse tools: Expected 'tools' to be an array, got 1; tools = 1"
  ),
  ...both(
    "a tool has a type",
    { tools: ["a"] },
    500,
    'Failed to parse tools: Missing tool type: "a"; tools = [\n  "a"\n]'
  ),
  ...both(
    "a tool's function has a name",
    { tools: [{ type: "function", function: {} }] },
    500,
    `Failed to parse tools: [json.exception.out_of_range.403] key 'name' not found; tools = [\n  {\n    "type": "function",\n    "function": {}\n  }\n]`
  ),
  ...both("tools are taken", { tools: [TOOL] }, 200),
  ...both(
    "a grammar beside tools",
    { tools: [TOOL], grammar: 'root ::= "a"' },
    400,
    "Cannot use custom grammar constraints with tools."
  ),
  ...both("tool_choice is auto, none or required", { tool_choice: "x" }, 400, "Invalid tool_choice: x"),
  ...both("a tool_choice that is no string is auto", { tool_choice: 1 }, 200),
  ...both(
    "tools before tool_choice",
    { tool_choice: "x", tools: 1 },
    500,
    "Failed to parse tools: Expected 'tools' to be an array, got 1; tools = 1"
  ),
  ...both(
    "the chat's checks before the schema's fields",
    { tool_choice: "x", return_tokens: 1 },
    400,
    "Invalid tool_choice: x"
  ),
  ...both(
    "response_format's type",
    { response_format: { type: "nope" } },
    400,
    'response_format type must be one of "text" or "json_object", but got: nope'
  ),
  ...both("a response_format type that is no string is none", { response_format: { type: 1 } }, 200),
  ...both("reasoning_format is a known one (500)", { reasoning_format: "x" }, 500, "Unknown reasoning format: x"),
  ...both(
    "reasoning_format is a string, null included (500)",
    { reasoning_format: null },
    500,
    "[json.exception.type_error.302] type must be string, but is null"
  ),
  ...both(
    "json_schema beside a grammar",
    { json_schema: {}, grammar: 'root ::= "a"' },
    500,
    "Cannot use both json_schema and grammar"
  ),
  ...both(
    "json_schema beside a grammar, before anything",
    { json_schema: 1, grammar: "x", tools: 1 },
    500,
    "Cannot use both json_schema and grammar"
  ),
  ...both(
    "continue_final_message with add_generation_prompt (true by default)",
    { continue_final_message: "content" },
    400,
    "Cannot set both add_generation_prompt and continue_final_message to true."
  ),
  ...both("continue_final_message that is no continuation", { continue_final_message: "x" }, 200),
  ...both(
    "enable_thinking is no string",
    { chat_template_kwargs: { enable_thinking: "yes" } },
    400,
    'invalid type for "enable_thinking" (expected boolean, got string)'
  ),
  ...both(
    "the template's json_schema that does not convert",
    { json_schema: { type: "nope" }, top_logprobs: 1 },
    400,
    `${UNABLE}JSON schema conversion failed:\nUnrecognized schema: {"type":"nope"}`
  ),
  ...both(
    "response_format's json_schema goes to the template",
    { response_format: { type: "json_schema", json_schema: { schema: { type: "nope" } } } },
    400,
    `${UNABLE}JSON schema conversion failed:\nUnrecognized schema: {"type":"nope"}`
  ),
  ...both(
    "logprobs with tools in a stream",
    { tools: [TOOL], logprobs: true, stream: true },
    400,
    "logprobs is not supported with tools + stream"
  ),
  ...both(
    "top_logprobs without logprobs",
    { top_logprobs: 2 },
    400,
    "top_logprobs requires logprobs to be set to true"
  ),
  ...both(
    "a trailing assistant message with tool calls is not continued",
    { messages: [...user, { role: "assistant", content: "b", tool_calls: [CALL] }] },
    400,
    "Cannot continue an assistant message that contains tool calls."
  ),
  ...both("one with none is", { messages: [...user, { role: "assistant", content: "b", tool_calls: [] }] }, 200),
  ...both(
    "a tool call has a type",
    { messages: [{ role: "assistant", tool_calls: [1] }] },
    500,
    "Failed to parse messages: Missing tool call type: 1"
  ),
  ...both(
    "a tool call has arguments",
    { messages: [{ role: "assistant", tool_calls: [{ type: "function", function: { name: "f" } }] }] },
    500,
    "Failed to parse messages: [json.exception.out_of_range.403] key 'arguments' not found"
  ),
  ...both(
    "a message's name is a string",
    { messages: [{ role: "user", content: "a", name: 1 }] },
    500,
    "Failed to parse messages: [json.exception.type_error.302] type must be string, but is number"
  ),
  ...both(
    "tools before two trailing assistant messages",
    {
      messages: [
        { role: "assistant", content: "a" },
        { role: "assistant", content: "b" }
      ],
      tools: 1
    },
    500,
    "Failed to parse tools: Expected 'tools' to be an array, got 1; tools = 1"
  ),
  ...both(
    "two trailing assistant messages, exactly",
    {
      messages: [
        { role: "assistant", content: "a" },
        { role: "assistant", content: "b" }
      ]
    },
    400,
    "Cannot have 2 or more assistant messages at the end of the list."
  ),
  ...both(
    "continue_final_message continues a trailing message with tool calls only if it is the assistant's",
    {
      messages: [{ role: "user", content: "a", tool_calls: [CALL] }],
      continue_final_message: true,
      add_generation_prompt: false
    },
    200
  ),
  ...both("tool_choice required", { tools: [TOOL], tool_choice: "required" }, 200),
  ...both(
    "a grammar beside tools that tool_choice none turns off",
    { tools: [TOOL], tool_choice: "none", grammar: 'root ::= "a"' },
    200
  ),
  ...both("logprobs with tools, not streamed", { tools: [TOOL], logprobs: true }, 200),
  ...both(
    "continue_final_message reasoning_content continues",
    { continue_final_message: "reasoning_content" },
    400,
    "Cannot set both add_generation_prompt and continue_final_message to true."
  ),
  ...both(
    "a json_object response_format's schema replaces json_schema",
    { json_schema: { type: "string" }, response_format: { type: "json_object", schema: { type: "nope" } } },
    400,
    `${UNABLE}JSON schema conversion failed:\nUnrecognized schema: {"type":"nope"}`
  ),
  ...both(
    "a message's tool_call_id is a string",
    { messages: [{ role: "user", content: "a", tool_call_id: 1 }] },
    500,
    "Failed to parse messages: [json.exception.type_error.302] type must be string, but is number"
  ),
  ...both(
    "a tool call's id is a string",
    { messages: [{ role: "assistant", tool_calls: [{ ...CALL, id: 1 }] }] },
    500,
    "Failed to parse messages: [json.exception.type_error.302] type must be string, but is number"
  ),
  {
    why: "a chat's json_schema that is no object is the schema field's",
    path: "/v1/chat/completions",
    body: { messages: user, max_tokens: 2, json_schema: [1] },
    status: 400,
    message: "Field 'json_schema': \"json_schema\": JSON schema conversion failed:\nUnrecognized schema: [1]"
  },
  {
    why: "/apply-template reads no schema field",
    path: "/apply-template",
    body: { messages: user, json_schema: [1] },
    status: 200,
    answer: { prompt: "<|im_start|>user\na b<|im_end|>\n<|im_start|>assistant\n" }
  }
]
