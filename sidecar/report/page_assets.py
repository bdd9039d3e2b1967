"""The HTML page's inline style and its one script of its own (sidecar/report/page.py writes
them into every page: nothing is fetched when it opens)."""

from __future__ import annotations

ERRORS_ATTR = "data-page-errors"  # on <html>: how many script or load errors the page saw
LOADED_ATTR = "data-page-loaded"  # on <html>: "1" once the load event ran
BROKEN_ATTR = "data-page-broken-images"  # on <html> at load: images that did not decode

# Counts every script error and every resource that fails to load (a capture listener sees
# those too) on <html>, and at load the images that did not decode, so that a headless
# browser's DOM dump says whether the page ran cleanly.
ERROR_SCRIPT = f"""
(function () {{
  var root = document.documentElement;
  function note(what) {{
    root.setAttribute("{ERRORS_ATTR}", String(+root.getAttribute("{ERRORS_ATTR}") + 1));
    root.setAttribute("data-page-error-list",
                      (root.getAttribute("data-page-error-list") || "") + what + "\\n");
  }}
  window.addEventListener("error", function (e) {{
    var t = e.target;
    note(e.message || ("failed to load " + (t && (t.src || t.href || t.tagName))));
  }}, true);
  window.addEventListener("unhandledrejection", function (e) {{ note("rejected: " + e.reason); }});
  window.addEventListener("load", function () {{
    var broken = Array.prototype.filter.call(document.images, function (img) {{
      return !(img.complete && img.naturalWidth > 0);
    }});
    root.setAttribute("{BROKEN_ATTR}", String(broken.length));
    root.setAttribute("{LOADED_ATTR}", "1");
  }});
}})();
"""

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", "DejaVu Sans", sans-serif;
  margin: 0; color: #1d1d1f; background: #f6f5f2; font-size: 14px; }
header { background: #23303f; color: #fff; padding: 14px 24px 8px; }
header h1 { margin: 0 0 4px; font-size: 20px; font-weight: 600; }
header .meta { margin: 0 0 8px; color: #c9d3de; font-size: 13px; }
nav a { color: #9cc3ff; margin-right: 14px; text-decoration: none; font-size: 13px; }
main { padding: 8px 24px 24px; max-width: 1280px; }
section, aside.caveats { background: #fff; border: 1px solid #e3e0da; border-radius: 6px;
  padding: 8px 16px 14px; margin: 14px 0; }
aside.caveats { border-color: #e6b800; background: #fffbea; }
h2 { font-size: 17px; margin: 6px 0 10px; }
h3 { font-size: 15px; margin: 14px 0 6px; }
h4 { margin: 4px 0; font-size: 14px; }
h4 small { color: #777; font-weight: normal; }
pre.profile { background: #f3f2ee; padding: 10px; border-radius: 4px; overflow-x: auto;
  font-size: 12.5px; line-height: 1.35; }
.cards { display: flex; flex-wrap: wrap; gap: 10px; margin-bottom: 10px; }
.card { border: 1px solid #e3e0da; border-radius: 6px; padding: 6px 12px; min-width: 150px; }
.card .label { color: #666; font-size: 12px; }
.card .value { font-size: 20px; font-weight: 600; }
.missing { color: #8a6d00; }
.card .value.missing { font-size: 14px; font-weight: normal; padding-top: 5px; }
.ok { color: #2e7d32; }
.roles { display: grid; grid-template-columns: repeat(auto-fit, minmax(380px, 1fr));
  gap: 8px 24px; }
.stack { display: flex; height: 14px; border-radius: 3px; overflow: hidden;
  background: #eee; margin: 4px 0 6px; }
.stack span { display: block; height: 100%; }
table { border-collapse: collapse; }
table.bars { width: 100%; }
table.bars td { padding: 1px 4px; font-size: 12.5px; }
td.phase { white-space: nowrap; width: 150px; }
td.phase i { display: inline-block; width: 10px; height: 10px; border-radius: 2px;
  margin-right: 5px; border: 1px solid #aaa; }
td.barcell { width: 55%; }
.bar { display: block; height: 11px; border-radius: 2px; background: #4e79a7; min-width: 1px; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
table.memory { width: 100%; }
table.memory th { text-align: left; width: 130px; padding: 4px; vertical-align: top; }
table.memory td { padding: 4px; vertical-align: top; }
table.memory td.barcell { width: 30%; }
table.memory .track { display: block; background: #eee; border-radius: 2px; margin-top: 2px; }
table.memory .bar { height: 14px; }
tr[data-memory="kv"] .bar { background: #f28e2b; }
tr[data-memory="host"] .bar { background: #59a14f; }
.sub { color: #555; font-size: 12.5px; }
table.processes, table.changes { font-size: 12.5px; }
table.processes td, table.processes th, table.changes td, table.changes th {
  border-bottom: 1px solid #eee; padding: 3px 8px; text-align: left; }
td.title { max-width: 520px; word-break: break-all; font-family: monospace; font-size: 12px; }
.flame svg { width: 100%; height: auto; display: block; }
img.trend { max-width: 100%; display: block; }
article.finding { border-left: 5px solid #4e79a7; padding: 4px 12px; margin: 8px 0;
  background: #f8f9fb; }
article.finding.warning { border-color: #e6a100; }
article.finding.critical { border-color: #c62828; }
article.finding h3 { margin: 4px 0; }
.severity { text-transform: uppercase; font-size: 11px; letter-spacing: 0.05em; color: #555; }
.verdict p { margin: 4px 0; font-weight: 500; }
.sides { color: #555; font-size: 12.5px; }
footer { color: #777; font-size: 12px; padding: 0 24px 24px; }
"""
