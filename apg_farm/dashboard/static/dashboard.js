// apg-farm dashboard: polls the page's JSON API (body[data-api]) and updates the figures in place.
// Served from /static/ under a CSP without 'unsafe-inline'. Every value a bed may have printed is
// written with textContent, never innerHTML.
(function () {
  "use strict";
  var body = document.body;
  var api = body.dataset.api;
  var page = body.dataset.page;
  var every = parseInt(body.dataset.pollMs || "2000", 10) || 2000;
  if (!api || !page) {
    return;
  }

  function clock(seconds) {
    // As the server writes it (apg_farm.dashboard.app._clock): 1h02m03s, 4m05s.
    if (seconds === null || seconds === undefined) {
      return "unknown";
    }
    var whole = Math.round(seconds);
    var hours = Math.floor(whole / 3600);
    var minutes = Math.floor((whole % 3600) / 60);
    var secs = whole % 60;
    var two = function (n) { return (n < 10 ? "0" : "") + n; };
    return hours ? hours + "h" + two(minutes) + "m" + two(secs) + "s" : minutes + "m" + two(secs) + "s";
  }

  function shareText(share) {
    // As the sweeps page renders it: claims got of the pool's recent ones, and what the weight asks.
    if (!share) {
      return "—";
    }
    if (!share.of_claims) {
      return "no claims yet";
    }
    var text = share.claims + "/" + share.of_claims + " (" + Math.round(100 * share.claimed_share) + " %";
    if (share.expected_share !== null) {
      text += ", asks " + Math.round(100 * share.expected_share) + " %";
    }
    return text + ")";
  }

  function usd(value) {
    // As the reports write dollars: 4 decimals below $1, else 2.
    if (value === null || value === undefined) {
      return "—";
    }
    var digits = value < 1 ? 4 : 2;
    return "$" + value.toLocaleString("en-US", { minimumFractionDigits: digits, maximumFractionDigits: digits });
  }

  function pct(value) {
    // As the server writes rates (apg_farm.dashboard.app._pct): 41.7%.
    return (100 * value).toFixed(1) + "%";
  }

  function sortKey(cell, kind) {
    // A cell's data-value when it has one (numbers behind formatted text), else its text.
    var raw = cell && cell.dataset.value !== undefined ? cell.dataset.value : (cell ? cell.textContent : "");
    if (kind === "number") {
      var n = parseFloat(raw);
      return isNaN(n) ? -Infinity : n;
    }
    return String(raw).toLowerCase();
  }

  function sortable(table) {
    // Click a head with data-sort: the rows shown sort by that column; again: the other way.
    var heads = table.querySelectorAll("th[data-sort]");
    heads.forEach(function (th) {
      th.addEventListener("click", function () {
        var index = Array.prototype.indexOf.call(th.parentElement.children, th);
        var kind = th.dataset.sort;
        var up = th.getAttribute("aria-sort") !== "ascending";
        heads.forEach(function (other) { other.removeAttribute("aria-sort"); });
        th.setAttribute("aria-sort", up ? "ascending" : "descending");
        var tbody = table.tBodies[0];
        var rows = Array.prototype.slice.call(tbody.rows).filter(function (tr) { return tr.cells.length > 1; });
        rows.sort(function (a, b) {
          var x = sortKey(a.cells[index], kind);
          var y = sortKey(b.cells[index], kind);
          return (x < y ? -1 : x > y ? 1 : 0) * (up ? 1 : -1);
        });
        rows.forEach(function (tr) { tbody.appendChild(tr); });
      });
    });
  }

  document.querySelectorAll("table.sortable").forEach(sortable);

  function byId(id) {
    return document.getElementById(id);
  }

  function setText(id, text) {
    var el = byId(id);
    if (el) {
      el.textContent = String(text);
    }
  }

  function td(tr, text, className) {
    var cell = document.createElement("td");
    cell.textContent = String(text);
    if (className) {
      cell.className = className;
    }
    tr.appendChild(cell);
    return cell;
  }

  function progress(value, max) {
    var bar = document.createElement("progress");
    bar.value = value;
    bar.max = max || 1;
    return bar;
  }

  function fill(tbodyId, rows, build, empty, columns) {
    var tbody = byId(tbodyId);
    if (!tbody) {
      return;
    }
    tbody.replaceChildren();
    rows.forEach(function (row) {
      var tr = document.createElement("tr");
      build(tr, row);
      tbody.appendChild(tr);
    });
    if (!rows.length && empty) {
      var tr = document.createElement("tr");
      var cell = td(tr, empty, "l muted");
      cell.colSpan = columns;
      tbody.appendChild(tr);
    }
  }

  function list(ulId, items, empty) {
    var ul = byId(ulId);
    if (!ul) {
      return;
    }
    ul.replaceChildren();
    items.forEach(function (item) {
      var li = document.createElement("li");
      li.textContent = item.text;
      if (item.className) {
        li.className = item.className;
      }
      ul.appendChild(li);
    });
    if (!items.length && empty) {
      var li = document.createElement("li");
      li.textContent = empty;
      li.className = "muted";
      ul.appendChild(li);
    }
  }

  // The beds page (templates/beds.html): a tile per bed, grouped by host, the beds that need a
  // person in a table above them. Filtering is client side; removed beds show on request.
  function canaryWord(c) {
    return !c || !c.count ? "never" : c.last_result;
  }

  function canaryClass(c) {
    if (!c || !c.count) {
      return "muted";
    }
    return c.last_result === "healthy" ? "ok" : c.last_result === "inconclusive" ? "warn" : "bad";
  }

  function renderBeds(data) {
    var beds = {};
    data.hosts.forEach(function (group) {
      group.beds.forEach(function (b) { beds[b.name] = b; });
    });
    var section = byId("attention");
    var shown = section ? section.dataset.attention : "";
    var filter = byId("bed-filter");
    if (shown !== data.attention.join(" ") && !(filter && filter.value)) {
      // A bed came to need a person, or stopped to: the page's order changes, so read it anew.
      window.location.reload();
      return;
    }
    document.querySelectorAll("a.tile[data-bed]").forEach(function (tile) {
      var b = beds[tile.dataset.bed];
      if (!b) {
        return;
      }
      // Text only: every value here may quote what a bed printed.
      tile.className = "tile " + b.state + (b.problem ? " " + b.problem : "");
      var put = function (field, text, className) {
        var el = tile.querySelector('[data-field="' + field + '"]');
        if (el) {
          el.textContent = String(text);
          if (className !== undefined) {
            el.className = className;
          }
        }
      };
      put("state", b.problem || b.state);
      put("now", !b.running ? "idle" : b.running.phase ? b.running.phase + " " + clock(b.running.phase_elapsed) : "between phases");
      put("last", b.last_result || "—");
      put("canary", canaryWord(b.canary), canaryClass(b.canary));
    });
    filterBeds();
  }

  function filterBeds() {
    // Shows the tiles and rows whose text holds every word typed; a host with none is hidden.
    var box = byId("bed-filter");
    var words = box ? box.value.toLowerCase().split(/\s+/).filter(Boolean) : [];
    var removed = byId("show-removed");
    var withRemoved = Boolean(removed && removed.checked);
    body.classList.toggle("show-removed", withRemoved);
    var count = 0;
    document.querySelectorAll("[data-search]").forEach(function (el) {
      var text = el.dataset.search.toLowerCase();
      var match = words.every(function (w) { return text.indexOf(w) !== -1; });
      el.hidden = !match;
      if (match && el.classList.contains("tile") && (withRemoved || !el.classList.contains("removed"))) {
        count += 1;
      }
    });
    document.querySelectorAll("section.host").forEach(function (host) {
      var visible = Array.prototype.some.call(host.querySelectorAll("a.tile"), function (tile) {
        return !tile.hidden && (withRemoved || !tile.classList.contains("removed"));
      });
      host.hidden = !visible;
    });
    var attention = byId("attention");
    if (attention) {
      attention.hidden = !attention.querySelector("tr[data-search]:not([hidden])");
    }
    setText("filter-count", words.length ? count + " beds match" : "");
  }

  function setUpBeds() {
    var box = byId("bed-filter");
    var removed = byId("show-removed");
    if (box) {
      box.addEventListener("input", filterBeds);
    }
    if (removed) {
      removed.addEventListener("change", filterBeds);
    }
    filterBeds();
  }

  if (page === "beds") {
    setUpBeds();
  }

  var render = {
    sweeps: function (data) {
      var rows = {};
      data.sweeps.forEach(function (s) { rows[String(s.id)] = s; });
      document.querySelectorAll("tr[data-sweep-id]").forEach(function (tr) {
        var s = rows[tr.dataset.sweepId];
        if (!s) {
          return;
        }
        var put = function (field, text, value) {
          var el = tr.querySelector('[data-field="' + field + '"]');
          if (el) {
            el.textContent = String(text);
            if (value !== undefined) {
              el.dataset.value = String(value);
            }
          }
        };
        put("state", s.state);
        put("done", s.done);
        put("total", s.total);
        var done = tr.querySelector('[data-field="done"]');
        if (done && done.parentElement) {
          done.parentElement.dataset.value = String(s.done);
        }
        put("running", s.running);
        put("queued", s.queued);
        put("pass_rate", s.pass_rate === null ? "—" : pct(s.pass_rate), s.pass_rate === null ? -1 : s.pass_rate);
        put("tampered", s.tampered);
        put("invalid", s.invalid);
        put("error", s.error);
        put("spent", usd(s.spent_usd), s.spent_usd);
        put("budget", s.budget_usd === null ? "none" : usd(s.budget_usd), s.budget_usd === null ? -1 : s.budget_usd);
        put("priority", s.share ? s.share.priority : "—");
        put("share", shareText(s.share));
        var bar = tr.querySelector('[data-field="progress"]');
        if (bar) {
          bar.max = s.total || 1;
          bar.value = s.done;
        }
      });
    },

    sweep: function (data) {
      var s = data.sweep;
      var snap = data.live;
      setText("sweep-state", s.state);
      setText("done-count", snap.done);
      setText("total-count", snap.total);
      setText("running-count", snap.running.length);
      setText("queued-count", snap.queued);
      setText("active-beds", snap.active_beds);
      var finished = snap.queued === 0 && snap.running.length === 0;
      setText("eta", finished ? "finished" : "ETA " + clock(snap.eta_seconds));
      // The page was built while the sweep ran: its result leads once reloaded.
      var note = byId("finished-note");
      if (note) {
        note.hidden = !finished;
      }
      setText("median", clock(snap.median_execution_seconds));
      setText("spent", usd(s.spent_usd));
      setText("budget", s.budget_usd === null ? "(no budget set)" : "of " + usd(s.budget_usd));
      var bar = byId("progress");
      if (bar) {
        bar.max = snap.total || 1;
        bar.value = snap.done;
      }
      var pace = snap.pace || { paused: [], paused_models: [], max_concurrent: {} };
      var paused = [];
      if (snap.capacity) {
        paused.push({ text: "capacity: " + snap.capacity, className: "warn capacity" });
      }
      pace.paused.forEach(function (reason) {
        paused.push({ text: "paused: " + reason + "; raise it with `apg-farm budget set`", className: "bad" });
      });
      pace.paused_models.forEach(function (g) {
        var wait = g.waiting_for === "back-off" ? "until " + g.until : "probe running";
        paused.push({ text: "model " + g.model + " paused: provider trouble (" + g.trouble + "), " + g.trips + " in a row, " + wait, className: "warn" });
      });
      Object.keys(pace.max_concurrent).forEach(function (model) {
        var cap = pace.max_concurrent[model];
        paused.push({ text: "model " + model + ": " + cap.running + " running of max_concurrent " + cap.max });
      });
      list("paused", paused, null);
      fill("models-live", snap.models, function (tr, row) {
        td(tr, row.model, "l");
        td(tr, "", "l").appendChild(progress(row.done, row.total));
        td(tr, row.done + "/" + row.total);
        td(tr, row.running);
        td(tr, row.passed + "/" + row.counted);
        td(tr, row.invalid, row.invalid ? "warn" : "");
        td(tr, row.error, row.error ? "warn" : "");
      }, null, 7);
      fill("running-live", snap.running, function (tr, row) {
        td(tr, row.bed, "l");
        td(tr, row.task, "l");
        td(tr, row.model, "l");
        td(tr, row.trial);
        td(tr, row.execution);
        // No phase: the bed is between two commands (the engine records one, starts the next).
        td(tr, row.phase || "—", "l");
        td(tr, row.phase ? clock(row.phase_elapsed) : "—");
        td(tr, clock(row.elapsed));
      }, "no attempt running", 8);
      list("quarantined", snap.quarantined.map(function (q) {
        return { text: q.bed + ": " + (q.reason || "") };
      }), "none");
    },

    beds: function (data) {
      renderBeds(data);
    },

    attempt: function (data) {
      // A running attempt's page reloads when a phase was recorded or the attempt finished.
      var phases = data.executions.reduce(function (n, e) { return n + e.phases.length; }, 0);
      if (String(phases) !== body.dataset.phases || data.state !== body.dataset.state) {
        window.location.reload();
      }
    },
  };

  function schedule() {
    window.setTimeout(tick, every);
  }

  function tick() {
    if (document.hidden || (page === "attempt" && body.dataset.state === "done")) {
      schedule();
      return;
    }
    fetch(api, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (response) {
        if (!response.ok) {
          throw new Error("HTTP " + response.status);
        }
        return response.json();
      })
      .then(function (data) {
        render[page](data);
        setText("updated-at", new Date().toLocaleTimeString());
      })
      .catch(function (error) {
        setText("updated-at", "failed (" + error.message + ")");
      })
      .then(schedule);
  }

  schedule();
})();
