// llama-server's POST routes that a server started without the flag that enables them refuses with a 501 before it
// reads the body (so whatever the body is), as the simulator's llama_cpp flavor answers them: it serves none of them,
// and answered 404 before (tools/server/server.cpp registers them; tools/server/server-context.cpp's handlers check
// first: post_infill the model's FIM tokens, handle_embeddings_impl params.embedding, post_rerank params.embedding and
// the rank pooling, post_props params.endpoint_props, post_slots params.slot_save_path, post_transcriptions_oai a
// multimodal projector with audio). Where the command line (or the environment variable common/arg.cpp reads for the
// flag) enables one, the simulator cannot serve it and leaves it to its 404. Measured against the real binary
// (test/real/sim-differential-13.test.ts).

interface Unsupported {
  readonly paths: (path: string) => boolean
  /** The flags and environment variables that enable the route (common/arg.cpp). */
  readonly enablers: ReadonlyArray<string>
  readonly message: string
}

const among =
  (...paths: ReadonlyArray<string>) =>
  (p: string) =>
    paths.includes(p)

const UNSUPPORTED: ReadonlyArray<Unsupported> = [
  {
    // the simulator's llama SentencePiece models have no FIM tokens (llama_vocab_fim_pre, _suf, _mid)
    paths: among("/infill"),
    enablers: [],
    message:
      "Infill is not supported by this model: prefix token is missing. suffix token is missing. middle token is missing. "
  },
  {
    paths: among("/embedding", "/embeddings", "/v1/embeddings"),
    enablers: ["--embedding", "--embeddings", "--rerank", "--reranking", "LLAMA_ARG_EMBEDDINGS", "LLAMA_ARG_RERANKING"],
    message: "This server does not support embeddings. Start it with `--embeddings`"
  },
  {
    paths: among("/rerank", "/reranking", "/v1/rerank", "/v1/reranking"),
    enablers: ["--rerank", "--reranking", "LLAMA_ARG_RERANKING"],
    message: "This server does not support reranking. Start it with `--reranking`"
  },
  {
    paths: among("/props"),
    enablers: ["--props", "LLAMA_ARG_ENDPOINT_PROPS"],
    message: "This server does not support changing global properties. Start it with `--props`"
  },
  {
    // cpp-httplib's "/slots/:id_slot": one path segment after /slots/, an empty one too (measured)
    paths: (p) => /^\/slots\/[^/]*$/.test(p),
    enablers: ["--slot-save-path"],
    message: "This server does not support slots action. Start it with `--slot-save-path`"
  },
  {
    // a projector comes with -mm, -mmu, or with the model of -hf (its mmproj, unless --no-mmproj)
    paths: among("/v1/audio/transcriptions", "/audio/transcriptions"),
    enablers: [
      "-mm",
      "--mmproj",
      "-mmu",
      "--mmproj-url",
      "-hf",
      "-hfr",
      "--hf-repo",
      "LLAMA_ARG_MMPROJ",
      "LLAMA_ARG_HF_REPO"
    ],
    message: "The current model does not support audio input."
  }
]

/**
 * The 501 message of a POST to `path`, or undefined where llama-server has no such route or it is enabled:
 * `enabled` tells whether a flag is on the command line or an environment variable is set.
 */
export const unsupportedMessage = (path: string, enabled: (name: string) => boolean): string | undefined => {
  const u = UNSUPPORTED.find((x) => x.paths(path))
  return u === undefined || u.enablers.some(enabled) ? undefined : u.message
}
