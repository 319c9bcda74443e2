/* pgtick console: live updates without a reload. Every few seconds (the page's
   data-live-seconds) the page's own URL is fetched again and each region marked data-live is
   replaced by the same region of the fresh page (rendered and escaped by the server, as on a
   load). One request in flight per page, none while the tab is hidden, slower after failures.
   Pages work without it: they are plain HTML, and those that refreshed before still do
   (<noscript> meta refresh). No third-party code; loaded only under the page's CSP nonce. */
(function () {
  "use strict";
  var seconds = Number(document.body.getAttribute("data-live-seconds") || "0");
  if (!(seconds > 0) || !window.fetch || !window.DOMParser) {
    return;
  }
  var state = document.getElementById("live-state");
  var failures = 0;

  function show(text) {
    if (state) {
      state.textContent = text;
    }
  }

  function later(delay) {
    window.setTimeout(poll, delay);
  }

  function swap(fresh) {
    var regions = document.querySelectorAll("[data-live][id]");
    for (var i = 0; i < regions.length; i += 1) {
      var region = regions[i];
      var next = fresh.getElementById(region.id);
      if (!next || next.outerHTML === region.outerHTML) {
        continue;
      }
      var active = document.activeElement;
      if (active && active !== document.body && region.contains(active)) {
        continue; /* someone is using it: next time */
      }
      region.replaceWith(document.importNode(next, true));
    }
  }

  function poll() {
    if (document.hidden) {
      later(seconds * 1000);
      return;
    }
    window
      .fetch(window.location.href, {
        credentials: "same-origin",
        cache: "no-store",
        redirect: "manual",
        headers: { "X-Pgtick-Live": "1" }
      })
      .then(function (response) {
        if (response.status !== 200) {
          throw new Error("status " + response.status);
        }
        return response.text();
      })
      .then(function (text) {
        swap(new DOMParser().parseFromString(text, "text/html"));
        failures = 0;
        show("live");
        later(seconds * 1000);
      })
      .catch(function () {
        failures += 1;
        show("live updates paused (reload to retry now)");
        later(Math.min(60, seconds * Math.pow(2, failures)) * 1000);
      });
  }

  show("live");
  later(seconds * 1000);
})();
