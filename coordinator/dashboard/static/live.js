// The job page's live panel: server-sent events re-render it at each state change (WatchJob
// on the server) until the job is terminal, or the session ends (logout in another tab,
// expiry): then the server closes the stream and the panel says so.
(function () {
  var live = document.getElementById("live");
  if (!live || !live.dataset.events) return;
  var source = new EventSource(live.dataset.events);
  function stop() {
    source.close();
    document.querySelectorAll(".live-note").forEach(function (n) { n.remove(); });
    live.dataset.ended = "1";
  }
  function sessionEnded() {
    stop();
    var note = document.createElement("p");
    note.id = "session-ended";
    note.className = "note";
    note.textContent = "Your session has ended: live updates stopped. Log in again to follow this job.";
    live.after(note);
  }
  source.addEventListener("job", function (e) { live.innerHTML = e.data; });
  source.addEventListener("end", stop);
  source.addEventListener("failed", stop);
  source.addEventListener("ended", sessionEnded);
  // A reconnect the server refused (401 once the session is over) closes the source for good.
  source.addEventListener("error", function () {
    if (source.readyState === EventSource.CLOSED && !live.dataset.ended) sessionEnded();
  });
})();
