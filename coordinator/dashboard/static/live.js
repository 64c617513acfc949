// The job page's live panel: server-sent events re-render it at each state change (WatchJob
// on the server) until the job is terminal.
(function () {
  var live = document.getElementById("live");
  if (!live || !live.dataset.events) return;
  var source = new EventSource(live.dataset.events);
  function stop() {
    source.close();
    document.querySelectorAll(".live-note").forEach(function (n) { n.remove(); });
    live.dataset.ended = "1";
  }
  source.addEventListener("job", function (e) { live.innerHTML = e.data; });
  source.addEventListener("end", stop);
  source.addEventListener("failed", stop);
})();
