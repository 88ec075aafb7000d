// What a browser test watches on a page: console errors, uncaught exceptions and requests that
// leave the page's origin (the page must fetch nothing but its own files and models).
import { test, type Page } from "@playwright/test";

/** Console errors, uncaught exceptions and requests outside the origin, as they happen. */
export function watch(page: Page) {
  const seen = { errors: [] as string[], outside: [] as string[] };
  page.on("console", (m) => { if (m.type() === "error") seen.errors.push(m.text()); });
  page.on("pageerror", (e) => seen.errors.push(`uncaught: ${e.message}`));
  const origin = new URL(test.info().project.use.baseURL!).origin;
  page.on("request", (r) => {
    const url = new URL(r.url());
    if (!["data:", "blob:"].includes(url.protocol) && url.origin !== origin) seen.outside.push(r.url());
  });
  return seen;
}
