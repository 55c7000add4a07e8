// The console's live parts: a block with data-live is fetched again every
// data-every milliseconds and swapped in whole (the server renders it, so
// the page and its refresh show the same thing). A followed event stops
// the refresh once it has settled. Plain JavaScript, no build step.

const live = document.getElementById("live");
if (live) {
  const every = Number(live.dataset.every) || 2000;
  const settled = () => live.querySelector("[data-settled=true]") !== null;
  const refresh = async () => {
    if (settled()) return;
    try {
      const resp = await fetch(live.dataset.live, {
        headers: { "X-Console-Fetch": "1" },
        credentials: "same-origin",
      });
      if (resp.status === 401) {
        location.assign("/login?next=" + encodeURIComponent(location.pathname + location.search));
        return;
      }
      if (resp.ok) {
        live.innerHTML = await resp.text();
        live.dataset.refreshed = new Date().toISOString();
      }
    } catch (e) {
      // The server is restarting or the network is down: keep the last
      // view and try again on the next tick.
    }
    setTimeout(refresh, every);
  };
  setTimeout(refresh, every);
}

// Dead letters: the header checkbox selects every row.
const all = document.getElementById("select-all");
if (all) {
  all.addEventListener("change", () => {
    for (const box of document.querySelectorAll("#letters input[name=seq]")) box.checked = all.checked;
  });
}
