// Page-independent bits of UI: the flash line and the in-page confirmation dialog.

let flashTimer = null;

/** Show a short status line at the top (kind: "ok" | "error" | "info"). */
export function flash(message, kind = "info") {
  const node = document.getElementById("flash");
  node.textContent = message;
  node.className = `flash flash-${kind}`;
  node.hidden = false;
  clearTimeout(flashTimer);
  flashTimer = setTimeout(() => {
    node.hidden = true;
  }, kind === "error" ? 12_000 : 6_000);
}

/**
 * Ask in the page's own modal dialog (not window.confirm, which blocks the page and
 * cannot show formatted counts). Resolves true when the user confirms.
 */
export function confirmDialog({ title, text, ok = "Confirm", danger = true }) {
  const dialog = document.getElementById("confirm");
  document.getElementById("confirm-title").textContent = title;
  document.getElementById("confirm-text").textContent = text;
  const okButton = document.getElementById("confirm-ok");
  okButton.textContent = ok;
  okButton.className = danger ? "danger" : "primary";
  dialog.returnValue = "";
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), { once: true });
    dialog.showModal();
    document.getElementById("confirm-cancel").focus();
  });
}

/** Run an action from a button: disable it meanwhile, flash the error if it fails. */
export async function busy(button, action) {
  button.disabled = true;
  try {
    return await action();
  } catch (e) {
    flash(`${e.kind ?? "Error"}: ${e.message}`, "error");
    return undefined;
  } finally {
    button.disabled = false;
  }
}
