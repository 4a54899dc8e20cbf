"""Run moto's server on 127.0.0.1 with every request serialized.

Why serialized: moto's DynamoDB backend evaluates a condition expression and then writes the
item with no lock around the two, so two concurrent conditional writes can both pass their
check (lost updates were reproduced here with Python's switch interval lowered). Real DynamoDB
applies each conditional write atomically. Wrapping the whole WSGI app in one lock restores that
atomicity, so the concurrency tests test our protocol and not moto's threading.

Usage: python moto_server.py [--port N] [--port-file PATH] [--parent-pid PID]
  --port 0 picks a free port; the chosen port is printed and written to --port-file.
  With --parent-pid the server exits when that process is gone (a test binary that spawned
  it cannot run destructors on exit).
"""

import argparse
import os
import socket
import sys
import threading
import time


def serialized(app):
    lock = threading.Lock()

    def wrapped(environ, start_response):
        with lock:
            # Drain the body inside the lock: a lazy iterable would run outside it.
            return [b"".join(app(environ, start_response))]

    return wrapped


def watch_parent(pid):
    while True:
        try:
            os.kill(pid, 0)
        except OSError:
            os._exit(0)
        time.sleep(0.5)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--port-file")
    parser.add_argument("--parent-pid", type=int)
    args = parser.parse_args()

    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import make_server

    class NoDelayHandler(MotoRequestHandler):
        # Werkzeug writes the head and the body of a response separately; with Nagle's
        # algorithm on, the body then waits for the client's delayed ACK (~40 ms a request).
        def setup(self):
            super().setup()
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    app = serialized(DomainDispatcherApplication(create_backend_app))
    server = make_server(
        "127.0.0.1", args.port, app, threaded=True, request_handler=NoDelayHandler
    )
    port = server.socket.getsockname()[1]
    # moto's own service-to-service calls (e.g. Step Functions tasks) go to MOTO_PORT.
    os.environ["MOTO_PORT"] = str(port)
    if args.parent_pid:
        threading.Thread(target=watch_parent, args=(args.parent_pid,), daemon=True).start()
    if args.port_file:
        tmp = args.port_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(str(port))
        os.replace(tmp, args.port_file)
    print(f"moto (serialized) listening on http://127.0.0.1:{port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
