// Small HTTP reads the end-to-end tests share.

/** GET `url`: its status and body text. */
export const fetchText = async (url: string): Promise<{ readonly status: number; readonly body: string }> => {
  const res = await fetch(url)
  return { status: res.status, body: await res.text() }
}
