#!/usr/bin/python3
"""A python3-kubernetes watch loop: the healthy re-dialing Python client.

Run it with /usr/bin/python3 (Debian's python3-kubernetes is installed for that interpreter):

    /usr/bin/python3 py-watch.py --kubeconfig PATH [--namespace NS] [--timeout-seconds N]
        [--settle S]

Forever: watch.Watch().stream(CoreV1Api().list_namespaced_pod, NS, timeout_seconds=N) and print
one line per event on stdout, `<TYPE> <name> <resourceVersion>`, then `WATCH_END` when the server
ends the watch (it is started again at once). With `--timeout-seconds 0` no timeout is asked for:
the server ends the watch after its own 30-60 min, and the library watches again by itself.
On any exception it prints `ERROR <type>: <text>` on stderr, sleeps 1 s and dials again.
With `--settle S` it first lists the namespace's pods and waits S seconds (lifeline probes a
client's libssl once the client is connected: a request made before is not seen).
"""
import argparse
import sys
import time

from kubernetes import client, config, watch


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--namespace", default="default")
    parser.add_argument("--timeout-seconds", type=int, default=60)
    parser.add_argument("--settle", type=float, default=0)
    args = parser.parse_args()

    config.load_kube_config(config_file=args.kubeconfig)
    v1 = client.CoreV1Api()
    if args.settle > 0:
        v1.list_namespaced_pod(args.namespace)
        time.sleep(args.settle)
    while True:
        try:
            timeout = {"timeout_seconds": args.timeout_seconds} if args.timeout_seconds > 0 else {}
            stream = watch.Watch().stream(v1.list_namespaced_pod, args.namespace, **timeout)
            for event in stream:
                meta = event["object"].metadata
                print(event["type"], meta.name, meta.resource_version, flush=True)
            print("WATCH_END", flush=True)
        except Exception as e:  # noqa: BLE001 - any failure means: dial again
            print(f"ERROR {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            time.sleep(1)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        pass
