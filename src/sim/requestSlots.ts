// The slots one request's sequences take on its engine core, through the core's Scheduler (at most maxSeqs run
// at once across all requests, the rest wait in arrival order). vLLM, SGLang and mlx-lm admit a request whole:
// its tickets are taken together and held to the request's end. llama-server runs each prompt of a request as a
// task of its own, posted together (tools/server/server-context.cpp handle_completions_impl: one server_task per
// prompt; a prompt's `n` completions are child tasks launched with their parent, launch_slots_with_parent_task).
// A task takes an idle slot or is deferred (process_single_task: get_available_slot, queue_tasks.defer); a slot is
// released at its task's last token (update_slots: send_final_response, then server_slot::release) and the first
// deferred task goes to the front of the queue (callback_on_release: server-queue.cpp pop_deferred_task). So tasks
// run in arrival order across requests, at most -np at once, each from its first token to its last. Measured
// against the real server (test/real/sim-differential-4.test.ts): with -np 1 a three-prompt stream is choice 0 to
// its end, `data: null`, choice 1 to its end, `data: null`, choice 2; with -np 2 choices 0 and 1 interleave and 2
// starts once one of them has ended, beside the next request's task. A task's prompt is evaluated once it holds
// its slot (update_slots), so a later task's first token comes a prompt's time (the TTFT knob) after it took its
// slot, the request's other tasks generating meanwhile (measured: with -np 1 a long prompt's task begins, `data:
// null`, as the one before ends and makes its first token that long after; the first task's TTFT is generate.ts's).
// Its slot is the one the server's prompt-similarity rule or LRU picks (llamaSlots.ts similar, scheduler.ts).

import type { SlotBook, SlotTask } from "./llamaSlots.ts"
import type { GenRequest } from "./request.ts"
import type { Scheduler, Ticket } from "./scheduler.ts"
import type { SeqGate } from "./sequences.ts"
import type { SimConfig } from "./simConfig.ts"

/** What of a request its slots show (/slots): sequence `index`'s task. */
const slotTask = (gr: Pick<GenRequest, "endpoint" | "sequences" | "stream" | "ignoreEos" | "llama">, index: number) => {
  const q = gr.sequences[index]
  const o = gr.llama
  const task: SlotTask = {
    promptTokens: q?.promptTokens ?? 0,
    nPredict: o?.nPredict ?? -1,
    chat: gr.endpoint === "chat",
    stream: gr.stream,
    seed: q?.seed,
    ignoreEos: gr.ignoreEos,
    nProbs: o?.nProbs ?? 0,
    timingsPerToken: o?.timingsPerToken ?? false,
    postSamplingProbs: o?.postSamplingProbs ?? false,
    shown: o?.shown
  }
  return task
}

interface Task {
  /** Its sequences: [from, to). */
  readonly from: number
  readonly to: number
  readonly tickets: ReadonlyArray<Ticket>
}

export class RequestSlots implements SeqGate {
  private readonly tasks: ReadonlyArray<Task>
  private readonly all: ReadonlyArray<Ticket>
  /** llama-server: each sequence holds a slot of its own, freed at its end. */
  private readonly perSequence: boolean
  private readonly done: Array<boolean>
  private readonly launched: Array<boolean>
  private readonly book: SlotBook
  /** Resolves when the request's first task holds its slots. */
  readonly first: Promise<void>
  /** Per task: whether its prompt is evaluated (its TTFT after it took its slots), and a promise of that. */
  private readonly ready: Array<boolean>
  private readonly whenReady: Array<Promise<void>>
  private readonly tokens: (index: number) => ReadonlyArray<string>
  /** The prompt evaluations under way (a later task's TTFT), cleared with the request: an abort keeps no timer. */
  private readonly timers = new Set<NodeJS.Timeout>()

  /**
   * The request's sequences on an engine core's scheduler. llama-server's take a ticket each, in order, its tasks
   * starting at the first sequence and at each of `begins` (request.ts), and show in its slots (`book`). Other
   * engines take min(sequences, maxSeqs) tickets for the whole request.
   */
  constructor(
    cfg: Pick<SimConfig, "flavor" | "maxSeqs"> & Partial<Pick<SimConfig, "ttftMs" | "slotPromptSimilarity">>,
    core: { readonly scheduler: Scheduler; readonly slotBook: SlotBook },
    gr: Pick<GenRequest, "endpoint" | "sequences" | "stream" | "ignoreEos" | "llama">
  ) {
    const sequences = gr.sequences.length
    this.perSequence = cfg.flavor === "llama_cpp"
    this.book = core.slotBook
    this.done = Array.from({ length: sequences }, () => false)
    const bounds = this.perSequence ? [0, ...(gr.llama?.begins ?? []), sequences] : [0, sequences]
    const ttft = cfg.ttftMs ?? 0
    // the first task's TTFT is generate.ts's; a task with none is ready as it takes its slots
    this.ready = bounds.slice(0, -1).map((_, i) => i === 0 || ttft <= 0)
    const marks = this.ready.map((r) => (r ? () => {} : undefined))
    this.whenReady = this.ready.map((r, i) => (r ? Promise.resolve() : new Promise<void>((ok) => (marks[i] = ok))))
    // the slot's tokens (llamaSlots.ts): the prompt's, with its BOS where it has one, a chat's as its template
    // renders it (request.ts, llamaTemplate.ts)
    this.tokens = (index) => {
      const q = gr.sequences[index]
      return q?.tokens ?? q?.words ?? []
    }
    // the tasks' ids, taken as they are posted (handle_completions_impl: each prompt's, then its children's)
    const firstId = this.perSequence ? this.book.reserve(sequences) : 0
    const similarity = cfg.slotPromptSimilarity ?? 0.1
    this.tasks = bounds.slice(0, -1).map((from, i) => {
      const to = bounds[i + 1] ?? sequences
      if (!this.perSequence) {
        const n = Math.max(1, Math.min(to - from, cfg.maxSeqs))
        return { from, to, tickets: Array.from({ length: n }, () => core.scheduler.enter()) }
      }
      // a prompt's `n` completions take their slots together (n is at most -np: llamaRequest.ts)
      const admit = (slot: number, k: number) => {
        this.book.start(slot, slotTask(gr, from + k), this.tokens(from + k), firstId + from + k, k > 0)
        if (k === 0 && !this.ready[i]) {
          const timer = setTimeout(() => {
            this.timers.delete(timer)
            this.ready[i] = true
            marks[i]?.()
          }, ttft)
          this.timers.add(timer)
        }
      }
      const prefer = (free: ReadonlyArray<number>) => this.book.similar(free, this.tokens(from), similarity)
      const tickets = core.scheduler.enterGroup(to - from, admit, prefer)
      return { from, to, tickets }
    })
    this.all = this.tasks.flatMap((t) => t.tickets)
    this.launched = this.tasks.map(() => false)
    this.first = this.admitted(this.tasks[0])
  }

  private admitted(task: Task | undefined): Promise<void> {
    return Promise.all((task?.tickets ?? []).map((t) => t.admitted)).then(() => {})
  }

  /** Whether task `k` has been launched: all its sequences took their slots (a parent is launched with its children). */
  private running(k: number): boolean {
    if (!this.launched[k] && this.tasks[k]?.tickets.every((t) => t.holds())) this.launched[k] = true
    return this.launched[k] === true
  }

  private taskIndex(index: number): number {
    return this.tasks.findIndex((t) => index >= t.from && index < t.to)
  }

  /** Whether sequence `index` holds its slot and its task's prompt is evaluated: it makes tokens. */
  holds(index: number): boolean {
    const k = this.taskIndex(index)
    return !this.perSequence || (this.running(k) && this.ready[k] === true)
  }

  next(): Promise<void> {
    const k = this.tasks.findIndex(
      (t, k) => !(this.running(k) && this.ready[k]) && this.done.slice(t.from, t.to).includes(false)
    )
    // its slot taken first (its begin goes out then: sequences.ts), its prompt evaluated after
    return this.running(k) ? (this.whenReady[k] ?? Promise.resolve()) : this.admitted(this.tasks[k])
  }

  /** A decode step of its sequences (the loop's NEXT_RESPONSE task takes an id: llamaSlots.ts). */
  step(): void {
    if (this.perSequence) this.book.taskId()
  }

  token(index: number, piece: string): void {
    const slot = this.ticket(index)?.slot()
    if (this.perSequence && slot !== undefined) this.book.token(slot, piece.trim())
  }

  private ticket(index: number): Ticket | undefined {
    const task = this.tasks[this.taskIndex(index)]
    return task?.tickets[index - task.from]
  }

  ended(index: number): void {
    this.done[index] = true
    const t = this.ticket(index)
    if (!this.perSequence || t === undefined) return
    if (t.holds()) this.book.ended(t.slot())
    this.free(t)
  }

  /** Releases a ticket, its slot told first (a child's keeps no tokens). */
  private free(t: Ticket): void {
    if (this.perSequence && t.holds()) this.book.released(t.slot())
    t.release()
  }

  /** Its sequences generating now: holding their slots, not ended (llama-server's decode steps, Stats.decoded). */
  generating(): number {
    return this.done.filter((d, i) => !d && this.holds(i)).length
  }

  /** How many sequences, from the first on, hold their slots now (their tasks begun, `data: null`). */
  holding(): number {
    const n = this.done.findIndex((_, i) => this.perSequence && !this.running(this.taskIndex(i)))
    return n < 0 ? this.done.length : n
  }

  /** Frees its slots (running) and leaves the queue (waiting). Idempotent. */
  release(): void {
    for (const timer of this.timers) clearTimeout(timer)
    this.timers.clear()
    for (const t of this.all) this.free(t)
  }
}
