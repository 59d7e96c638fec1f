// The messages an Effect logs, captured in order: for tests of what a combinator or a loop says.
import { Effect, Logger } from "effect"

/** Every logged message's text (its first part); `provide` routes an effect's logs here. */
export const captureMessages = () => {
  const lines: Array<string> = []
  const logger = Logger.make(({ message }) => {
    lines.push(String([message].flat()[0]))
  })
  return { lines, provide: Effect.provide(Logger.layer([logger])) }
}
