"""The real Python client (PyPI felix-client) as a failover probe for felix-client-failover.

Publishes one keyed record after another to a cluster and prints a line per answer:
`ack <unix ns>` or `err <unix ns> <error>`, flushed, until stdin closes. A keyed publish
cannot use `at_least_once` in this client, so a failure is retried by this loop, as the
client's own notes say an application must.
"""

import argparse
import sys
import threading
import time

import felix


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seeds", required=True, help="host:port,host:port,...")
    p.add_argument("--ca", required=True)
    p.add_argument("--token", required=True)
    p.add_argument("--tenant", default="t1")
    p.add_argument("--namespace", required=True)
    p.add_argument("--stream", required=True)
    p.add_argument("--key", required=True)
    args = p.parse_args()

    done = threading.Event()

    def watch_stdin() -> None:
        sys.stdin.read()
        done.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    client = felix.Client(
        args.seeds.split(","),
        tenant_id=args.tenant,
        token=args.token,
        ca_file=args.ca,
    )
    print("ready", flush=True)
    i = 0
    while not done.is_set():
        try:
            client.publish(
                args.tenant,
                args.namespace,
                args.stream,
                b"py-%d" % i,
                key=args.key.encode(),
            )
            print("ack", time.time_ns(), flush=True)
        except Exception as e:  # every failure is retried by this loop
            print("err", time.time_ns(), type(e).__name__, str(e).replace("\n", " "), flush=True)
        i += 1


if __name__ == "__main__":
    main()
