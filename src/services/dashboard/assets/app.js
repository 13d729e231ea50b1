// gangway dashboard: fetch this page's <main> every 2 s and put it in
// place when it changed. The token travels in the query, as in the address
// the dashboard printed; nothing is sent anywhere else.
(function () {
  "use strict";
  var token = new URLSearchParams(window.location.search).get("t") || "";
  var main = document.getElementById("main");
  var live = document.getElementById("live");
  var last = main.innerHTML;
  var PERIOD = 2000;

  function logAtBottom() {
    var log = document.getElementById("log");
    return !log || log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
  }

  function scrollLog() {
    var log = document.getElementById("log");
    if (log) { log.scrollTop = log.scrollHeight; }
  }

  function update() {
    var url = window.location.pathname + "?t=" + encodeURIComponent(token) + "&part=main";
    fetch(url, { cache: "no-store", credentials: "omit" })
      .then(function (r) {
        if (!r.ok && r.status !== 404 && r.status !== 500) { throw new Error("HTTP " + r.status); }
        return r.text();
      })
      .then(function (html) {
        if (html !== last) {
          var follow = logAtBottom();
          main.innerHTML = html;
          last = html;
          if (follow) { scrollLog(); }
        }
        live.textContent = "live";
        live.className = "live";
        live.title = "updated " + new Date().toLocaleTimeString();
      })
      .catch(function () {
        live.textContent = "offline";
        live.className = "live offline";
      })
      .then(function () { window.setTimeout(update, PERIOD); });
  }

  scrollLog();
  window.setTimeout(update, PERIOD);
})();
