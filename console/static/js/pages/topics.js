// Topics: the list (with the create-topic action on an --admin console) and one topic's queues,
// ISR state, offsets and live messages/s chart.

import * as api from "../api.js";
import { TimeChart } from "../chart.js";
import { count, el, errorBox, link, rate, replace, table } from "../dom.js";

export function topicList(main, { config }) {
  const body = el("div");
  main.append(el("h1", {}, "Topics"), createTopicForm(config), body);
  return {
    async refresh() {
      const { topics } = await api.get("/api/topics");
      replace(body, table("topics", [
        { label: "topic", value: (t) => link(`/topics/${encodeURIComponent(t.topic)}`, t.topic) },
        { label: "queues", value: (t) => t.queues, num: true },
        { label: "messages", value: (t) => count(t.messages), num: true },
        { label: "messages/s", value: (t) => rate(t.rate), num: true },
        { label: "error", value: (t) => t.error },
      ], topics, "no topics yet"));
    },
  };
}

function createTopicForm(config) {
  if (!config.admin) {
    return el("p", { id: "read-only", class: "muted" },
      `Read-only console: restart it with \`${config.admin_how}\` to create topics here.`);
  }
  const result = el("div", { id: "create-result", class: "result" });
  const form = el("form", { id: "create-topic", class: "action" },
    el("label", {}, "new topic", el("input", { type: "text", name: "topic", required: true, pattern: "[A-Za-z0-9_.%\\-]+" })),
    el("label", {}, "queues", el("input", { type: "number", name: "queues", value: 8, min: 1, max: 1024 })),
    el("label", {}, "replicas", el("input", { type: "number", name: "replicas", value: 1, min: 1, max: 16 })),
    el("button", { type: "submit" }, "Create topic"),
    result);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const fields = new FormData(form);
    try {
      const created = await api.post("/api/topics", {
        topic: fields.get("topic"), queues: Number(fields.get("queues")), replicas: Number(fields.get("replicas")),
      });
      result.dataset.state = "done";
      replace(result, el("span", { class: "badge ok" }, "created"), " ",
        link(`/topics/${encodeURIComponent(created.topic)}`, created.topic), ` with ${created.queues.length} queues`);
    } catch (err) {
      result.dataset.state = "error";
      replace(result, errorBox(err.message));
    }
  });
  return form;
}

export function topicPage(main, { params: [name] }) {
  const summary = el("div", { class: "summary" });
  const chartBox = el("div", { id: "rate-chart", class: "chart" });
  const queues = el("div");
  const settings = el("div");
  main.append(el("h1", {}, "Topic ", el("span", { id: "topic-name" }, name)), summary,
    el("h2", {}, "Messages appended per second"), chartBox, el("h2", {}, "Queues"), queues,
    el("h2", {}, "Settings"), settings);
  const chart = new TimeChart(chartBox, { label: "messages/s", format: (v) => v.toFixed(v < 10 ? 1 : 0) });
  return {
    async refresh() {
      const t = await api.get(`/api/topics/${encodeURIComponent(name)}`);
      const minIsr = t.settings.min_insync_replicas;
      replace(summary,
        el("div", {}, "messages", el("span", { id: "messages" }, count(t.messages))),
        el("div", {}, "messages/s", el("span", { id: "rate" }, rate(t.rate) ?? "-")),
        el("div", {}, "queues", el("span", { id: "queue-count" }, t.queues.length)),
        el("div", {}, "replication factor", el("span", {}, t.replication_factor)));
      chart.update(t.history.t, t.history.rate);
      replace(queues, table("queues", [
        { label: "queue", value: (q) => q.queue_id, num: true },
        { label: "leader", value: (q) => q.leader ?? "none" },
        { label: "replicas", value: (q) => q.replicas.join(", ") },
        { label: "ISR", value: (q) => isrText(q, minIsr) },
        { label: "leader epoch", value: (q) => q.leader_epoch, num: true },
        { label: "min offset", value: (q) => q.min_offset, num: true },
        { label: "max offset", value: (q) => q.max_offset, num: true },
        { label: "messages", value: (q) => count(q.messages), num: true },
      ], t.queues));
      replace(settings, table("settings", [
        { label: "setting", value: ([k]) => k },
        { label: "value", value: ([, v]) => v },
      ], [
        ["retention", t.settings.retention_ms === null ? "broker default" : `${t.settings.retention_ms} ms`],
        ["message size max", `${t.settings.message_size_bytes_max} bytes`],
        ["min in-sync replicas", minIsr],
        ["unclean leader election", t.settings.unclean_leader_election ? "on" : "off"],
      ]));
    },
  };
}

// The ISR from the route (registered in-sync replicas), flagged when below the topic's minimum.
function isrText(queue, minIsr) {
  if (queue.isr_state === "no_leader") return el("span", { class: "badge bad" }, "no live leader");
  const members = ` ${queue.isr.join(", ")}`;
  if (queue.isr_state === "under_min") return [el("span", { class: "badge bad" }, `below min ${minIsr}`), members];
  return [el("span", { class: "badge ok" }, `${queue.isr.length} of ${queue.replicas.length} in sync`), members];
}
