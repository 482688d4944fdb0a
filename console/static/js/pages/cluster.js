// Cluster: problems first, then nameservers (and the controller), brokers, etcd, and the queues
// that need attention.

import * as api from "../api.js";
import { badge, bytes, count, el, replace, seconds, table, time } from "../dom.js";

export default function cluster(main) {
  const body = el("div");
  main.append(el("h1", {}, "Cluster"), body);
  return {
    async refresh() {
      const c = await api.get("/api/cluster");
      const controller = c.controller.id ? `${c.controller.id} (epoch ${c.controller.epoch})` : "none elected";
      replace(body,
        problems(c.problems),
        el("div", { class: "summary" },
          el("div", {}, "brokers", el("span", { id: "broker-count" }, c.brokers.length)),
          el("div", {}, "nameservers", el("span", { id: "nameserver-count" }, c.nameservers.length)),
          el("div", {}, "topics", el("span", { id: "topic-count" }, c.topics)),
          el("div", {}, "controller", el("span", { id: "controller" }, controller))),
        el("h2", {}, "Brokers"),
        table("brokers", [
          { label: "broker", value: (b) => b.broker_id },
          { label: "address", value: (b) => b.address },
          { label: "cluster", value: (b) => b.cluster },
          { label: "alive", value: (b) => badge(b.alive, b.alive ? "yes" : "no") },
          { label: "store", value: (b) => b.store_health && badge(b.store_health === "writable", b.store_health) },
          { label: "topics", value: (b) => count(b.topics), num: true },
          { label: "disk used", value: (b) => bytes(b.disk_used_bytes), num: true },
          { label: "connections", value: (b) => count(b.connections), num: true },
          { label: "flush", value: (b) => b.flush_mode },
          { label: "uptime", value: (b) => seconds(b.uptime_s), num: true },
          { label: "version", value: (b) => b.version },
          { label: "error", value: (b) => b.error },
        ], c.brokers, "no broker is registered"),
        el("h2", {}, "Nameservers"),
        table("nameservers", [
          { label: "address", value: (n) => n.address },
          { label: "started", value: (n) => time(n.started_ms) },
          { label: "controller", value: (n) => (n.controller ? `yes (epoch ${c.controller.epoch})` : "") },
        ], c.nameservers),
        el("h2", {}, "etcd"),
        table("etcd", [
          { label: "endpoints", value: (e) => e.endpoints },
          { label: "healthy", value: (e) => badge(e.healthy, e.healthy ? "yes" : "no") },
          { label: "version / error", value: (e) => e.version || e.error },
        ], [c.etcd]),
        queuesNeedingAttention(c.queues));
    },
  };
}

function problems(list) {
  if (!list.length) return el("div", { id: "problems", class: "banner ok" }, "Healthy: no problems found");
  return el("div", { id: "problems", class: "banner bad" }, `${list.length} problem(s)`,
    el("ul", {}, list.map((p) => el("li", {}, p))));
}

function queuesNeedingAttention(queues) {
  const rows = [
    ...queues.without_leader.map((q) => ({ ...q, why: "no live leader", isr: null })),
    ...queues.under_min_isr.map((q) => ({ ...q, why: `ISR below its minimum of ${q.min_insync_replicas}` })),
  ];
  if (!rows.length) return null;
  return [el("h2", {}, "Queues needing attention"), table("queue-problems", [
    { label: "topic", value: (q) => q.topic },
    { label: "queue", value: (q) => q.queue_id, num: true },
    { label: "problem", value: (q) => q.why },
    { label: "ISR", value: (q) => (q.isr ? q.isr.join(", ") : null) },
  ], rows)];
}
