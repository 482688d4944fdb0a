// Message lookup by id (the id `gms produce` and the SDK's send print). Keys are not indexed by
// the brokers yet, so there is no lookup by key.

import * as api from "../api.js";
import { count, el, errorBox, link, replace, table, time } from "../dom.js";

export default function messages(main) {
  const input = el("input", { type: "text", name: "id", id: "msg-id", placeholder: "message id (32 hex digits)",
    required: true, autocomplete: "off", spellcheck: "false" });
  const result = el("div", { id: "result", class: "result" });
  const form = el("form", { id: "lookup", class: "action" },
    el("label", {}, "message id", input), el("button", { type: "submit" }, "Look up"));
  main.append(el("h1", {}, "Message lookup"), form,
    el("p", { class: "muted" }, "By message id, as `gms produce` and the SDK's send return it."
      + " Lookup by key needs a key index, which the brokers do not keep yet."), result);

  const lookUp = async (id) => {
    result.dataset.state = "loading";
    replace(result, el("p", { class: "muted" }, "Looking up…"));
    try {
      show(result, await api.get(`/api/messages/${encodeURIComponent(id)}`));
      result.dataset.state = "found";
    } catch (err) {
      replace(result, errorBox(err.message));
      result.dataset.state = "error";
    }
  };
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const id = input.value.trim();
    history.replaceState(null, "", `/messages?id=${encodeURIComponent(id)}`);
    lookUp(id);
  });
  const given = new URLSearchParams(location.search).get("id");
  if (given) {
    input.value = given;
    lookUp(given);
  }
  return {};
}

function show(result, m) {
  const rows = [
    ["message id", m.msg_id],
    ["topic", link(`/topics/${encodeURIComponent(m.topic)}`, m.topic)],
    ["queue", m.queue_id],
    ["queue offset", m.queue_offset],
    ["broker", m.broker],
    ["tag", m.tag],
    ["keys", m.keys.join(", ")],
    ["properties", Object.entries(m.properties).map(([k, v]) => `${k}=${v}`).join(", ")],
    ["born", `${time(m.born_timestamp_ms)} from ${m.born_host || "-"}`],
    ["stored", time(m.store_timestamp_ms)],
    ["body size", `${count(m.body_bytes)} bytes`],
  ];
  replace(result,
    table("message", [
      { label: "field", value: ([k]) => k },
      { label: "value", value: ([k, v]) => el("span", { "data-field": k }, v ?? "-") },
    ], rows),
    el("h2", {}, m.body_truncated ? `Body (the start of ${count(m.body_bytes)} bytes)` : "Body"),
    el("pre", { id: "body", class: "body" }, m.body_preview));
}
