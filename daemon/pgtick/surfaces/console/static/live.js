/* pgtick console: live updates without a reload. Every few seconds (the page's
   data-live-seconds) the page's own URL is fetched again and each region marked data-live is
   brought up to date with the same region of the fresh page (rendered and escaped by the
   server, as on a load), changing only what changed. One request in flight per page, none while the tab is hidden, slower after failures.
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

  /* Bring one node up to date with its fresh copy, keeping every element whose place is the
     same: attributes and text are changed in place, and only a node whose kind or number of
     children changed is replaced (so what someone is reading or pointing at stays put). */
  function morph(node, fresh) {
    if (node.isEqualNode(fresh)) {
      return;
    }
    if (node.nodeType === 3 && fresh.nodeType === 3) {
      node.nodeValue = fresh.nodeValue;
      return;
    }
    if (
      node.nodeType !== 1 ||
      node.nodeName !== fresh.nodeName ||
      node.childNodes.length !== fresh.childNodes.length
    ) {
      node.replaceWith(document.importNode(fresh, true));
      return;
    }
    var i;
    for (i = node.attributes.length - 1; i >= 0; i -= 1) {
      if (!fresh.hasAttribute(node.attributes[i].name)) {
        node.removeAttribute(node.attributes[i].name);
      }
    }
    for (i = 0; i < fresh.attributes.length; i += 1) {
      var attr = fresh.attributes[i];
      if (node.getAttribute(attr.name) !== attr.value) {
        node.setAttribute(attr.name, attr.value);
      }
    }
    var olds = Array.prototype.slice.call(node.childNodes);
    var news = Array.prototype.slice.call(fresh.childNodes);
    for (i = 0; i < olds.length; i += 1) {
      morph(olds[i], news[i]);
    }
  }

  function swap(fresh) {
    var regions = document.querySelectorAll("[data-live][id]");
    for (var i = 0; i < regions.length; i += 1) {
      var region = regions[i];
      var next = fresh.getElementById(region.id);
      if (!next) {
        continue;
      }
      var active = document.activeElement;
      if (active && active !== document.body && region.contains(active)) {
        continue; /* someone is using it: next time */
      }
      morph(region, next);
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
