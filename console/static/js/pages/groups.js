// Consumer groups: the list, and one group's members, assignment, lag per queue, its lag over time
// and (on an --admin console) the reset-offsets action.

import * as api from "../api.js";
import { TimeChart } from "../chart.js";
import { count, el, errorBox, link, replace, table, time } from "../dom.js";

export function groupList(main) {
  const body = el("div");
  main.append(el("h1", {}, "Consumer groups"), body);
  return {
    async refresh() {
      const { groups } = await api.get("/api/groups");
      replace(body, table("groups", [
        { label: "group", value: (g) => link(`/groups/${encodeURIComponent(g.group)}`, g.group) },
        { label: "members", value: (g) => g.members, num: true },
        { label: "lag", value: (g) => count(g.lag), num: true },
      ], groups, "no consumer groups yet"));
    },
  };
}

export function groupPage(main, { params: [name], config }) {
  const summary = el("div", { class: "summary" });
  const chartBox = el("div", { id: "lag-chart", class: "chart" });
  const members = el("div");
  const queues = el("div");
  const reset = resetForm(name, config);
  main.append(el("h1", {}, "Consumer group ", el("span", { id: "group-name" }, name)), summary,
    el("h2", {}, "Lag over time"), chartBox, el("h2", {}, "Members"), members,
    el("h2", {}, "Lag per queue"), queues, reset.node);
  const chart = new TimeChart(chartBox, { label: "lag (messages)", format: (v) => count(v) });
  return {
    async refresh() {
      const g = await api.get(`/api/groups/${encodeURIComponent(name)}`);
      replace(summary,
        el("div", {}, "total lag", el("span", { id: "total-lag" }, count(g.lag))),
        el("div", {}, "members", el("span", { id: "member-count" }, g.members.length)));
      chart.update(g.history.t, g.history.lag);
      replace(members, table("members", [
        { label: "member", value: (m) => m.member },
        { label: "mode", value: (m) => m.mode },
        { label: "subscription", value: (m) => Object.entries(m.subscription).map(([t, e]) => `${t}: ${e}`).join(", ") },
        { label: "queues held", value: (m) => m.queues.map(([t, q]) => `${t}/${q}`).join(", ") },
        { label: "brokers", value: (m) => m.brokers.join(", ") },
        { label: "last heartbeat", value: (m) => time(m.last_seen_ms) },
      ], g.members, "no live members"));
      replace(queues, table("lag", [
        { label: "topic", value: (r) => link(`/topics/${encodeURIComponent(r.topic)}`, r.topic) },
        { label: "queue", value: (r) => r.queue_id, num: true },
        { label: "broker", value: (r) => r.broker },
        { label: "member", value: (r) => r.member },
        { label: "committed", value: (r) => r.committed, num: true },
        { label: "max offset", value: (r) => r.max_offset, num: true },
        { label: "lag", value: (r) => count(r.lag), num: true },
      ], g.queues));
      reset.addTopics(g.queues.map((r) => r.topic));
    },
  };
}

// {node, addTopics(names)}: the form offers the topics the group has queues on.
function resetForm(group, config) {
  if (!config.admin) {
    const note = el("p", { id: "read-only", class: "muted" },
      `Read-only console: restart it with \`${config.admin_how}\` to reset this group's offsets here.`);
    return { node: note, addTopics() {} };
  }
  const topicSelect = el("select", { name: "topic", required: true });
  const addTopics = (names) => {
    const known = new Set([...topicSelect.options].map((o) => o.value));
    [...new Set(names)].filter((t) => !known.has(t)).forEach((t) => topicSelect.append(el("option", { value: t }, t)));
  };
  const result = el("div", { id: "reset-result", class: "result" });
  const form = el("form", { id: "reset-offsets", class: "action" },
    el("label", {}, "topic", topicSelect),
    el("label", {}, "move to", el("select", { name: "to" },
      ["earliest", "latest", "offset", "shift-by", "datetime"].map((m) => el("option", { value: m }, m)))),
    el("label", {}, "value (offset, shift, or time)", el("input", { type: "text", name: "value" })),
    el("label", {}, "force (members are live)", el("input", { type: "checkbox", name: "force" })),
    el("button", { type: "submit" }, "Reset offsets"),
    result);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const fields = new FormData(form);
    const to = fields.get("to");
    const raw = fields.get("value").trim();
    const value = raw === "" ? null : to === "datetime" ? raw : Number(raw);
    try {
      const done = await api.post(`/api/groups/${encodeURIComponent(group)}/reset-offsets`, {
        topic: fields.get("topic"), to, value, force: fields.get("force") === "on",
      });
      result.dataset.state = "done";
      replace(result, el("span", { class: "badge ok" }, "reset"), " ",
        done.queues.map((q) => `${q.topic}/${q.queue_id} → ${q.new_offset ?? "unchanged"}`).join(", "));
    } catch (err) {
      result.dataset.state = "error";
      replace(result, errorBox(err.message));
    }
  });
  return { node: form, addTopics };
}
