// Whether llama-server takes a request's `grammar` (GBNF) (pure), so the llama_cpp flavor refuses what the real
// server refuses (test/real/sim-differential-3.test.ts and -6 hold it to it; `json_schema`: llamaJsonSchema.ts). The
// simulator constrains no output: a grammar it takes changes nothing in what it generates. Source,
// ggml-org/llama.cpp src/llama-grammar.cpp (llama_grammar_parser::parse, llama_grammar_init_impl).

/** A rule element as llama_grammar_parser builds it: a reference to a rule, or a terminal (char, class, token). */
type Elem = { readonly ref: number } | { readonly term: true }
type Seq = Array<Elem>

/** llama-grammar.cpp MAX_REPETITION_THRESHOLD. */
const MAX_REPETITION = 2000

class GrammarError extends Error {}

const isWord = (c: string | undefined): boolean => c !== undefined && /^[a-zA-Z0-9-]$/.test(c)
const isDigit = (c: string | undefined): boolean => c !== undefined && c >= "0" && c <= "9"
const HEX: Record<string, number> = { x: 2, u: 4, U: 8 }

/**
 * A port of llama_grammar_parser's syntax (rules, literals, classes, groups, repetitions, tokens, comments) that keeps
 * of each rule only what llama_grammar_init_impl's checks need: its alternates' rule references and terminals.
 * Not modelled: `<text>` tokens (llama.cpp takes them when the model's vocabulary makes one token of them: taken
 * here), the "number of rules ... exceeds sane defaults" bound of nested repetitions, invalid UTF-8.
 */
class Parser {
  private pos = 0
  private readonly ids = new Map<string, number>()
  private next = 0
  readonly rules = new Map<number, Array<Seq>>()

  private readonly s: string
  constructor(s: string) {
    this.s = s
  }

  private at(i = 0): string | undefined {
    return this.s[this.pos + i]
  }

  private fail(what: string): never {
    throw new GrammarError(`${what} at ${this.s.slice(this.pos)}`)
  }

  /** get_symbol_id: a name's id, new on first sight (a reference makes one too). */
  private id(name: string): number {
    const known = this.ids.get(name)
    if (known !== undefined) return known
    const id = this.next++
    this.ids.set(name, id)
    return id
  }

  private space(newlineOk: boolean): void {
    for (;;) {
      const c = this.at()
      if (c === " " || c === "\t" || (newlineOk && (c === "\r" || c === "\n"))) this.pos++
      else if (c === "#") while (this.at() !== undefined && this.at() !== "\r" && this.at() !== "\n") this.pos++
      else return
    }
  }

  private name(): string {
    const start = this.pos
    while (isWord(this.at())) this.pos++
    if (this.pos === start) this.fail("expecting name")
    return this.s.slice(start, this.pos)
  }

  private int(): number {
    const start = this.pos
    while (isDigit(this.at())) this.pos++
    if (this.pos === start) this.fail("expecting integer")
    return Number(this.s.slice(start, this.pos))
  }

  /** parse_char: one character or one of the escapes GBNF knows. */
  private char(): void {
    const c = this.at()
    if (c === undefined) this.fail("unexpected end of input")
    if (c !== "\\") {
      this.pos++
      return
    }
    const e = this.at(1)
    const hex = e === undefined ? undefined : HEX[e]
    if (hex !== undefined) {
      this.pos += 2
      for (let i = 0; i < hex; i++, this.pos++) if (!/^[0-9a-fA-F]$/.test(this.at() ?? "")) this.fail("expecting hex")
    } else if (e !== undefined && 'trn\\"[]-'.includes(e)) this.pos += 2
    else this.fail("unknown escape")
  }

  /** parse_token: `<[id]>`, or `<text>` (one token of the model's vocabulary: not checked). */
  private token(): void {
    if (this.at() !== "<") this.fail("expecting '<'")
    this.pos++
    if (this.at() === "[") {
      this.pos++
      this.int()
      if (this.at() !== "]") this.fail("expecting ']'")
      this.pos++
    } else while (this.at() !== undefined && this.at() !== ">") this.pos++
    if (this.at() !== ">") this.fail("expecting '>'")
    this.pos++
  }

  /**
   * handle_repetitions: the last symbol (seq from `last`) rewritten into synthesized rules, as llama.cpp does.
   * `prevRules`: the rules that symbol already stands for (n_prev_rules: 1, a group's, or what earlier repetitions
   * of it made); the rules this one makes multiply it, refused from MAX_REPETITION on. Returns the new product.
   */
  private repeat(seq: Seq, last: number, min: number, max: number | undefined, prevRules: number): number {
    if (last === seq.length) this.fail("expecting preceding item to */+/?/{")
    const total = max !== undefined && max > 0 ? max : min > 0 ? min : 1
    if (prevRules * total >= MAX_REPETITION)
      this.fail("number of rules repeated times the repetition exceeds sane defaults")
    const prev = seq.slice(last)
    // min copies of it stay in the sequence (one more is enough for the checks that follow), none for min 0
    if (min === 0) seq.length = last
    else if (min > 1) seq.push(...prev)
    const nOpt = max === undefined ? 1 : max - min
    if (nOpt < 0) this.fail("fewer repetitions at most than at least")
    let lastRec = 0
    for (let i = 0; i < nOpt; i++) {
      const rec = this.next++ // generate_symbol_id: a synthesized rule
      const body: Seq = [...prev]
      if (i > 0 || max === undefined) body.push({ ref: max === undefined ? rec : lastRec })
      this.rules.set(rec, [body, []])
      lastRec = rec
    }
    if (nOpt > 0) seq.push({ ref: lastRec })
    return prevRules * total
  }

  private sequence(nested: boolean): Seq {
    const seq: Seq = []
    let last = 0
    let prevRules = 1 // n_prev_rules
    for (;;) {
      const c = this.at()
      if (c === '"' || c === "[") {
        this.pos++
        const close = c === '"' ? '"' : "]"
        if (c === "[" && this.at() === "^") this.pos++
        last = seq.length
        prevRules = 1
        while (this.at() !== close) {
          this.char()
          seq.push({ term: true })
          if (c === "[" && this.at() === "-" && this.at(1) !== "]") {
            if (this.at(1) === undefined) this.fail("unexpected end of input")
            this.pos++
            this.char()
          }
        }
        this.pos++
        this.space(nested)
      } else if (c === "<" || c === "!") {
        if (c === "!") this.pos++
        this.token()
        last = seq.length
        prevRules = 1
        seq.push({ term: true })
        this.space(nested)
      } else if (isWord(c)) {
        const ref = this.id(this.name())
        this.space(nested)
        last = seq.length
        prevRules = 1
        seq.push({ ref })
      } else if (c === "(") {
        this.pos++
        this.space(true)
        const before = this.next
        const sub = this.next++
        this.rules.set(sub, this.alternates(true))
        prevRules = Math.max(1, this.next - before)
        last = seq.length
        seq.push({ ref: sub })
        if (this.at() !== ")") this.fail("expecting ')'")
        this.pos++
        this.space(nested)
      } else if (c === ".") {
        last = seq.length
        prevRules = 1
        seq.push({ term: true })
        this.pos++
        this.space(nested)
      } else if (c === "*" || c === "+" || c === "?") {
        this.pos++
        this.space(nested)
        prevRules = this.repeat(seq, last, c === "+" ? 1 : 0, c === "?" ? 1 : undefined, prevRules)
      } else if (c === "{") {
        this.pos++
        this.space(nested)
        if (!isDigit(this.at())) this.fail("expecting an int")
        const min = this.int()
        this.space(nested)
        let max: number | undefined
        if (this.at() === "}") max = min
        else if (this.at() === ",") {
          this.pos++
          this.space(nested)
          if (isDigit(this.at())) {
            max = this.int()
            this.space(nested)
          }
          if (this.at() !== "}") this.fail("expecting '}'")
        } else this.fail("expecting ','")
        this.pos++
        this.space(nested)
        if (min > MAX_REPETITION) this.fail("number of repetitions exceeds sane defaults")
        prevRules = this.repeat(seq, last, min, max !== undefined && max > MAX_REPETITION ? undefined : max, prevRules)
      } else return seq
    }
  }

  private alternates(nested: boolean): Array<Seq> {
    const alts = [this.sequence(nested)]
    while (this.at() === "|") {
      this.pos++
      this.space(true)
      alts.push(this.sequence(nested))
    }
    return alts
  }

  private rule(): void {
    const id = this.id(this.name())
    this.space(false)
    if (this.s.slice(this.pos, this.pos + 3) !== "::=") this.fail("expecting ::=")
    this.pos += 3
    this.space(true)
    this.rules.set(id, this.alternates(false))
    if (this.at() === "\r") this.pos += this.at(1) === "\n" ? 2 : 1
    else if (this.at() === "\n") this.pos++
    else if (this.at() !== undefined) this.fail("expecting newline or end")
    this.space(true)
  }

  /** parse: every rule, then every referenced rule defined ("Undefined rule identifier"). */
  parse(): void {
    this.space(true)
    while (this.at() !== undefined) this.rule()
    for (const [name, id] of this.ids) if (!this.rules.has(id)) throw new GrammarError(`Undefined rule '${name}'`)
  }

  rootId(): number | undefined {
    return this.ids.get("root")
  }
}

/** llama_grammar_detect_left_recursion: a rule reached again through leftmost references (past empty-able ones). */
const leftRecursive = (rules: Map<number, Array<Seq>>): boolean => {
  const visited = new Set<number>()
  const inProgress = new Set<number>()
  const mayBeEmpty = new Set<number>()
  const detect = (id: number): boolean => {
    if (inProgress.has(id)) return true
    inProgress.add(id)
    const alts = rules.get(id) ?? []
    if (alts.some((a) => a.length === 0)) mayBeEmpty.add(id)
    for (const alt of alts) {
      for (const e of alt) {
        if (!("ref" in e)) break
        if (detect(e.ref)) return true
        if (!mayBeEmpty.has(e.ref)) break
      }
    }
    inProgress.delete(id)
    visited.add(id)
    return false
  }
  return [...rules.keys()].some((id) => !visited.has(id) && detect(id))
}

/**
 * Whether llama_sampler_init_grammar makes a grammar of `src` with the start rule `root` (common/sampling.cpp
 * common_sampler_init; it fails with "failed to parse grammar"): it parses, has a rule, defines `root`, and no rule
 * is left-recursive. The C string ends at a NUL character.
 */
export const grammarParses = (src: string): boolean => {
  const p = new Parser(src.split("\0")[0] ?? "")
  try {
    p.parse()
  } catch (e) {
    if (e instanceof GrammarError) return false
    throw e
  }
  return p.rules.size > 0 && p.rootId() !== undefined && !leftRecursive(p.rules)
}
