// Message lookup by id (the id `gms produce` and the SDK's send print), and by key (the brokers'
// key index: the newest messages of a topic carrying it).

import * as api from "../api.js";
import { count, el, errorBox, link, replace, table, time } from "../dom.js";

export default function messages(main) {
  const input = el("input", { type: "text", name: "id", id: "msg-id", placeholder: "message id (32 hex digits)",
    required: true, autocomplete: "off", spellcheck: "false" });
  const result = el("div", { id: "result", class: "result" });
  const form = el("form", { id: "lookup", class: "action" },
    el("label", {}, "message id", input), el("button", { type: "submit" }, "Look up"));
  const topicInput = el("input", { type: "text", name: "topic", id: "key-topic", placeholder: "topic",
    required: true, autocomplete: "off", spellcheck: "false" });
  const keyInput = el("input", { type: "text", name: "key", id: "key-key", placeholder: "message key",
    required: true, autocomplete: "off", spellcheck: "false" });
  const byKey = el("form", { id: "key-lookup", class: "action" },
    el("label", {}, "topic", topicInput), el("label", {}, "key", keyInput), el("button", { type: "submit" }, "Find"));
  main.append(el("h1", {}, "Message lookup"), form,
    el("p", { class: "muted" }, "By message id, as `gms produce` and the SDK's send return it; or by key:"), byKey,
    result);

  // result.dataset.state: loading, then found or error (the browser tests wait on it).
  const load = async (path, render) => {
    result.dataset.state = "loading";
    replace(result, el("p", { class: "muted" }, "Looking up…"));
    try {
      render(result, await api.get(path));
      result.dataset.state = "found";
    } catch (err) {
      replace(result, errorBox(err.message));
      result.dataset.state = "error";
    }
  };
  const lookUp = (id) => load(`/api/messages/${encodeURIComponent(id)}`, show);
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const id = input.value.trim();
    history.replaceState(null, "", `/messages?id=${encodeURIComponent(id)}`);
    lookUp(id);
  });
  const findByKey = (topic, key) =>
    load(`/api/keys?topic=${encodeURIComponent(topic)}&key=${encodeURIComponent(key)}`, showMatches);
  byKey.addEventListener("submit", (event) => {
    event.preventDefault();
    const topic = topicInput.value.trim();
    const key = keyInput.value.trim();
    history.replaceState(null, "", `/messages?topic=${encodeURIComponent(topic)}&key=${encodeURIComponent(key)}`);
    findByKey(topic, key);
  });
  const params = new URLSearchParams(location.search);
  const given = params.get("id");
  if (given) {
    input.value = given;
    lookUp(given);
  } else if (params.get("topic") && params.get("key")) {
    topicInput.value = params.get("topic");
    keyInput.value = params.get("key");
    findByKey(topicInput.value, keyInput.value);
  }
  return {};
}

function showMatches(result, found) {
  const heading = el("h2", {}, `${found.messages.length} message(s) of ${found.topic} with key ${found.key}`);
  replace(result, heading, table("matches", [
    { label: "message id", value: (m) => link(`/messages?id=${encodeURIComponent(m.msg_id)}`, m.msg_id) },
    { label: "queue", value: (m) => m.queue_id, num: true },
    { label: "offset", value: (m) => m.queue_offset, num: true },
    { label: "tag", value: (m) => m.tag ?? "-" },
    { label: "stored", value: (m) => time(m.store_timestamp_ms) },
    { label: "body", value: (m) => m.body_preview },
  ], found.messages));
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
