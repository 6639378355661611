#!/usr/bin/env python3
"""Serves a directory over HTTP on 127.0.0.1 at a free port, for shoot.sh.

    serve.py DIR PORT_FILE

Writes the port to PORT_FILE once it listens, then serves until killed. Quiet: no request log.
"""

import functools
import http.server
import sys


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def main():
    directory, port_file = sys.argv[1], sys.argv[2]
    handler = functools.partial(QuietHandler, directory=directory)
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        with open(port_file + ".tmp", "w") as f:
            f.write(str(server.server_address[1]))
        import os
        os.replace(port_file + ".tmp", port_file)  # whole, or not there yet
        server.serve_forever()


if __name__ == "__main__":
    main()
