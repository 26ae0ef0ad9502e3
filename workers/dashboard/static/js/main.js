// Boot and routing: read api/config, ask for the token when one is required, then
// render the page named by the location hash (#/overview, #/search?..., #/message/ID,
// #/schedules, #/dead[/GROUP], #/lateness). Each page gets a fresh context whose timers
// stop when the user navigates away.

import { ApiError, api, token } from "./api.js";
import { el, clear, fmtLocal } from "./dom.js";
import { flash } from "./ui.js";
import * as overview from "./pages/overview.js";
import * as search from "./pages/search.js";
import * as message from "./pages/message.js";
import * as schedules from "./pages/schedules.js";
import * as dead from "./pages/dead.js";
import * as lateness from "./pages/lateness.js";

const PAGES = { overview, search, message, schedules, dead, lateness };
const view = document.getElementById("view");
let config = null;
let current = null; // the context of the page on screen

/** "#/message/a%3Ab?x=1" -> {name: "message", parts: ["a:b"], query: URLSearchParams} */
function parseHash() {
  const raw = location.hash.replace(/^#\/?/, "");
  const [path, qs = ""] = raw.split("?", 2);
  const [name = "", ...parts] = path.split("/").map((p) => decodeURIComponent(p));
  return { name: name || "overview", parts: parts.filter((p) => p !== ""), query: new URLSearchParams(qs) };
}

function makeContext(route) {
  const timers = [];
  const ctx = {
    config,
    route,
    alive: true,
    /**
     * Call fn now and every ms while this page is shown (one call at a time). The
     * first call's promise is returned (its error shows as the page's error); a later
     * failure only flashes, and the next tick tries again.
     */
    poll(fn, ms) {
      let running = false;
      const tick = async () => {
        if (!ctx.alive || running) return;
        running = true;
        try {
          await fn();
        } finally {
          running = false;
        }
      };
      timers.push(
        setInterval(() => {
          tick().catch((e) => {
            if (ctx.alive && e.status !== 401) flash(`Refresh failed: ${e.message}`, "error");
          });
        }, ms),
      );
      return tick();
    },
    stop() {
      ctx.alive = false;
      timers.forEach(clearInterval);
    },
  };
  return ctx;
}

async function render() {
  if (current) current.stop();
  document.getElementById("flash").hidden = true; // it spoke of the page being left
  const route = parseHash();
  const page = PAGES[route.name];
  for (const a of document.querySelectorAll("#nav a")) {
    a.classList.toggle("active", a.dataset.route === route.name || (route.name === "message" && a.dataset.route === "search"));
  }
  clear(view);
  if (!page) {
    view.append(el("p", { class: "empty" }, "No such page. ", el("a", { href: "#/overview" }, "Go to the overview.")));
    return;
  }
  const ctx = makeContext(route);
  current = ctx;
  document.title = `${page.title} · chronoq`;
  try {
    await page.render(view, ctx);
  } catch (e) {
    if (!ctx.alive) return;
    if (e instanceof ApiError && e.status === 401) return; // the sign-in form is shown
    view.append(el("p", { class: "error-box" }, `${e.kind ?? "Error"}: ${e.message}`));
  }
}

function showSignIn(reason) {
  if (current) current.stop();
  current = null;
  document.getElementById("sign-out").hidden = true;
  const input = el("input", { id: "token-input", type: "password", autocomplete: "current-password", required: true, placeholder: "dashboard token" });
  const error = el("p", { id: "sign-in-error", class: "error-text", role: "alert" }, reason ?? "");
  const submit = el("button", { type: "submit", class: "primary", id: "sign-in" }, "Sign in");
  const form = el(
    "form",
    { class: "sign-in", id: "sign-in-form" },
    el("h1", {}, "Sign in"),
    // Password managers (and Chrome's form checks) expect a user name beside a password.
    el("input", { type: "text", name: "username", autocomplete: "username", value: "chronoq", hidden: true, tabindex: "-1" }),
    el("p", { class: "muted" }, "This dashboard needs its token (the --token of chronoq dashboard). It stays in this tab only."),
    input,
    submit,
    error,
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    token.set(input.value);
    submit.disabled = true;
    try {
      await api("api/overview"); // a cheap call that needs the token
    } catch (e) {
      token.clear();
      error.textContent = e.status === 401 ? "That token was refused. Check it and try again." : `${e.kind}: ${e.message}`;
      input.select();
      return;
    } finally {
      submit.disabled = false;
    }
    document.getElementById("sign-out").hidden = false;
    render();
  });
  clear(view).append(form);
  input.focus();
}

function startClock() {
  const node = document.getElementById("clock");
  const tick = () => {
    node.textContent = fmtLocal(Date.now());
  };
  tick();
  setInterval(tick, 1000);
}

async function boot() {
  try {
    config = await api("api/config");
  } catch (e) {
    clear(view).append(el("p", { class: "error-box" }, `Cannot reach the dashboard API: ${e.message}`));
    return;
  }
  document.getElementById("broker-kind").textContent = config.broker_kind;
  document.getElementById("version").textContent = `chronoq ${config.version}`;
  startClock();
  window.addEventListener("hashchange", () => {
    if (!config.token_required || token.get()) render();
  });
  window.addEventListener("chronoq:unauthorized", () => {
    if (document.getElementById("sign-in-form")) return; // the form reports it itself
    token.clear();
    showSignIn("The token was refused (it may have changed). Sign in again.");
  });
  document.getElementById("sign-out").addEventListener("click", () => {
    token.clear();
    flash("Signed out.");
    showSignIn();
  });
  if (config.token_required && !token.get()) {
    showSignIn();
  } else {
    document.getElementById("sign-out").hidden = !config.token_required;
    render();
  }
}

boot();
