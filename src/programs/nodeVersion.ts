/**
 * The Node version the agent needs, checked before anything else is loaded (main.ts). Imports nothing, so that
 * it runs on any Node. Keep MIN_NODE_MAJOR in step with package.json "engines".
 */

export const MIN_NODE_MAJOR = 24

/** The message to print when `version` (process.versions.node) is older than MIN_NODE_MAJOR; else undefined. */
export const nodeTooOld = (version: string, execPath: string): string | undefined => {
  const major = Number(version.split(".")[0])
  if (Number.isInteger(major) && major >= MIN_NODE_MAJOR) return undefined
  return (
    `cgn-agent needs Node.js ${MIN_NODE_MAJOR} or newer; this is Node.js ${version} (${execPath}). ` +
    `Install Node ${MIN_NODE_MAJOR} (https://nodejs.org, or nvm install ${MIN_NODE_MAJOR}) and run it with that node.`
  )
}
