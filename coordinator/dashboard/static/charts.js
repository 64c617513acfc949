// The overview's charts (uPlot): cluster throughput and lateness over the last hour, from
// the dashboard's own samples (/overview/series.json), redrawn every few seconds.
(function () {
  var width = function () { return Math.min(900, document.body.clientWidth - 40); };
  var tp = new uPlot({
    title: "jobs per second", width: width(), height: 220,
    series: [{}, { label: "submitted", stroke: "#3b6fd1" }, { label: "completed", stroke: "#2a9d4b" },
             { label: "failed", stroke: "#d1493b" }],
  }, [[], [], [], []], document.getElementById("throughput"));
  var late = new uPlot({
    title: "lateness of the most overdue scheduled job (ms)", width: width(), height: 160,
    series: [{}, { label: "late by (ms)", stroke: "#b36b00" }],
  }, [[], []], document.getElementById("lateness"));
  var timer;
  function refresh() {
    fetch("/overview/series.json", { credentials: "same-origin" })
      .then(function (r) {
        // The session ended (logout elsewhere, expiry): stop polling, back to the login page.
        if (r.status === 401) { clearInterval(timer); window.location.href = "/login"; return null; }
        return r.ok ? r.json() : null;
      })
      .then(function (s) {
        if (!s) return;
        tp.setData([s.t, s.submitted, s.completed, s.failed]);
        late.setData([s.t, s.lateness_ms]);
      });
  }
  refresh();
  timer = setInterval(refresh, 5000);
})();
