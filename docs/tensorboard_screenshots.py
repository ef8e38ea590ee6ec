#!/usr/bin/env python3
"""docs/tensorboard_screenshots.py - the README's TensorBoard screenshots.

    build/lenet --epochs 10 --logdir runs/lenet
    tensorboard --logdir runs --port 6006 --host 127.0.0.1 &
    python3 docs/tensorboard_screenshots.py     # needs chromium; stdlib only

Starts headless Chromium (1440x880) with its DevTools port and drives it
over the DevTools protocol (a minimal WebSocket client below):
  docs/tensorboard_scalars.png  the Scalars tab as it opens.
  docs/tensorboard_graphs.png   the Graphs tab for run "lenet". TensorBoard
      folds nodes of one op whose names end in consecutive numbers
      (dl_add_0 ... dl_add_6) into "series" nodes, which breaks the chain
      into pieces; every series is ungrouped first, as the button "Ungroup
      this series" of a series node's card does. Then the view is fitted,
      zoomed in with the mouse wheel, the node dl_conv_0 clicked (its card:
      inputs and outputs with their shapes) and zoomed with the wheel so
      that the first layers show.
"""
import base64, json, os, socket, struct, subprocess, sys, time, urllib.request

TB = "http://127.0.0.1:6006/"
PORT = 9333
W, H = 1440, 880
DOCS = os.path.dirname(os.path.abspath(__file__))


class CDP:
    """One page's DevTools connection: call(method, **params), js(expr), shot(path)."""

    def __init__(self, port):
        pages = json.load(urllib.request.urlopen("http://127.0.0.1:%d/json" % port))
        url = [p for p in pages if p["type"] == "page"][0]["webSocketDebuggerUrl"]
        hostport, path = url[len("ws://"):].split("/", 1)
        host, p = hostport.split(":")
        self.s = socket.create_connection((host, int(p)))
        key = base64.b64encode(os.urandom(16)).decode()
        self.s.sendall(("GET /%s HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                        "Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n" % (path, hostport, key)).encode())
        buf = b""
        while b"\r\n\r\n" not in buf:
            buf += self.s.recv(4096)
        self.rest = buf.split(b"\r\n\r\n", 1)[1]
        self.id = 0

    def _recvn(self, n):
        while len(self.rest) < n:
            d = self.s.recv(1 << 20)
            if not d:
                raise EOFError("DevTools connection closed")
            self.rest += d
        out, self.rest = self.rest[:n], self.rest[n:]
        return out

    def _recv(self):
        msg = b""
        while True:
            b0, b1 = self._recvn(2)
            n = b1 & 127
            if n == 126:
                n = struct.unpack(">H", self._recvn(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._recvn(8))[0]
            msg += self._recvn(n)
            if b0 & 0x80:
                return msg

    def call(self, method, **params):
        self.id += 1
        data = json.dumps({"id": self.id, "method": method, "params": params}).encode()
        mask, n = os.urandom(4), len(data)
        hdr = bytes([0x81]) + (bytes([0x80 | n]) if n < 126 else
                               bytes([0x80 | 126]) + struct.pack(">H", n) if n < 65536 else
                               bytes([0x80 | 127]) + struct.pack(">Q", n))
        self.s.sendall(hdr + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))
        while True:
            m = json.loads(self._recv())
            if m.get("id") == self.id:
                if "error" in m:
                    raise RuntimeError("%s: %s" % (method, m["error"]))
                return m["result"]

    def js(self, expr):
        r = self.call("Runtime.evaluate", expression=FIND + expr, awaitPromise=True, returnByValue=True)
        if "exceptionDetails" in r:
            raise RuntimeError(r["exceptionDetails"])
        return r["result"].get("value")

    def open(self, url, wait):
        self.call("Page.navigate", url="about:blank")
        time.sleep(1)
        self.call("Page.navigate", url=url)
        time.sleep(wait)

    def mouse(self, kind, x, y, **kw):
        self.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, **kw)

    def shot(self, path):
        open(path, "wb").write(base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"]))
        print("saved to", path)


# elements inside TensorBoard's shadow DOMs; a graph node's centre on screen
FIND = """
function deep(root, sel) {
  const out = [];
  const walk = (r) => r.querySelectorAll('*').forEach(e => { if (e.matches(sel)) out.push(e); if (e.shadowRoot) walk(e.shadowRoot); });
  walk(root); return out;
}
function nodeCenter(name) {
  const s = deep(document, 'tf-graph-scene')[0];
  const r = s.shadowRoot.querySelector('g[data-name="' + name + '"]').getBoundingClientRect();
  return [r.x + r.width / 2, r.y + r.height / 2];
}
"""


def main():
    chrome = subprocess.Popen(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                               "--remote-debugging-port=%d" % PORT, "--window-size=%d,%d" % (W, H), "about:blank"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(50):
            try:
                c = CDP(PORT)
                break
            except (OSError, IndexError):
                time.sleep(0.2)
        c.call("Page.enable")
        c.call("Emulation.setDeviceMetricsOverride", width=W, height=H, deviceScaleFactor=1, mobile=False)

        c.open(TB + "#scalars", 10)
        c.shot(os.path.join(DOCS, "tensorboard_scalars.png"))

        c.open(TB + "#graphs&run=lenet", 12)
        print(c.js("""(() => { const g = deep(document, 'tf-graph')[0], h = g.graphHierarchy;
          const names = Object.keys(h.getNodeMap()).filter(k => k.includes('['));
          const m = new Map(h.seriesGroupMap);   /* all but the last ungrouped here, the last by the toggle */
          names.slice(0, -1).forEach(n => m.set(n, h.buildSeriesGroupMapToggled(n).get(n)));
          h.seriesGroupMap = m;
          g.nodeToggleSeriesGroup(names[names.length - 1]);
          return 'series ungrouped: ' + names.join(' '); })()"""))
        time.sleep(8)
        c.js("deep(document, 'tf-graph-scene')[0].fit()")
        time.sleep(2)
        x, y = c.js("nodeCenter('Input_0')")
        for _ in range(4):                  # zoom in on the input
            c.mouse("mouseWheel", x, y, deltaX=0, deltaY=-300)
            time.sleep(0.5)
        time.sleep(1)
        x, y = c.js("nodeCenter('dl_conv_0')")
        c.mouse("mouseMoved", x, y)
        c.mouse("mousePressed", x, y, button="left", clickCount=1)
        c.mouse("mouseReleased", x, y, button="left", clickCount=1)
        time.sleep(3)                       # TensorBoard centres the node, opens its card
        for x, y, d in [(400, 860, 100)] * 4 + [(684, 400, -100), (684, 300, -100)]:
            c.mouse("mouseWheel", x, y, deltaX=0, deltaY=d)
            time.sleep(0.7)
        c.mouse("mouseMoved", W - 5, H - 5)
        time.sleep(2)
        c.shot(os.path.join(DOCS, "tensorboard_graphs.png"))
    finally:
        chrome.terminate()
        chrome.wait()


if __name__ == "__main__":
    main()
