// The console's one page script: picks the page for the path, loads the console's settings, and
// refreshes the page's data every sampling interval while the tab is visible.

import * as api from "./api.js";
import { errorBox, replace } from "./dom.js";
import cluster from "./pages/cluster.js";
import { groupList, groupPage } from "./pages/groups.js";
import messages from "./pages/messages.js";
import { topicList, topicPage } from "./pages/topics.js";

const ROUTES = [
  [/^\/$/, "cluster", cluster],
  [/^\/topics$/, "topics", topicList],
  [/^\/topics\/([^/]+)$/, "topics", topicPage],
  [/^\/groups$/, "groups", groupList],
  [/^\/groups\/([^/]+)$/, "groups", groupPage],
  [/^\/messages$/, "messages", messages],
];

// A page is a function (main, {params, config}) => {refresh?: async () => void}: it builds its
// skeleton (forms included) once; refresh() fetches and redraws its data, throwing ApiError.
async function start() {
  const main = document.getElementById("page");
  const route = ROUTES.find(([pattern]) => pattern.test(location.pathname));
  if (!route) {
    main.dataset.state = "error";
    replace(main, errorBox(`no page at ${location.pathname}: use the links above`));
    return;
  }
  const [pattern, nav, page] = route;
  document.querySelector(`nav a[data-nav="${nav}"]`).classList.add("active");
  let config;
  try {
    config = await api.get("/api/config");
  } catch (err) {
    main.dataset.state = "error";
    replace(main, errorBox(err.message));
    return;
  }
  document.getElementById("mode").textContent = config.admin ? "admin actions on" : "read-only";
  document.getElementById("footer").textContent = `gms ${config.version} · nameserver ${config.nameserver}`;
  const params = pattern.exec(location.pathname).slice(1).map(decodeURIComponent);
  replace(main);
  const view = page(main, { params, config });
  const status = document.createElement("div"); // refresh errors, under the page's heading
  status.id = "status";
  main.querySelector("h1").after(status);
  if (view.refresh) keepFresh(main, status, view.refresh, config.sample_interval_s * 1000);
  else main.dataset.state = "ready";
}

// Refresh now, then one interval after each refresh ends (never two at once).
function keepFresh(main, status, refresh, intervalMs) {
  const tick = async () => {
    if (!document.hidden) {
      try {
        await refresh();
        replace(status);
        main.dataset.state = "ready";
      } catch (err) {
        replace(status, errorBox(err.message));
        main.dataset.state = "error";
      }
    }
    setTimeout(tick, intervalMs);
  };
  tick();
}

start();
