#!/usr/bin/python3
"""A python3-kubernetes client that talks every second, like a controller renewing its
leader-election lease: the client whose own path can be blackholed (seed 002's variant without
a proxy). Its requests on a kept-alive connection are what gets retransmitted.

    /usr/bin/python3 py-lease.py --kubeconfig PATH [--namespace NS] [--interval SECONDS]

Lists the pods once, then reads the first one every interval on the same pooled connection,
printing `RENEWED <resourceVersion>`. No request timeout (like client-go's default for such
calls), so a blackholed request waits on the kernel's retransmissions. On an exception it prints
`ERROR ...` on stderr, sleeps 1 s and goes on.
"""
import argparse
import sys
import time

from kubernetes import client, config


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--namespace", default="default")
    parser.add_argument("--interval", type=float, default=1.0)
    args = parser.parse_args()

    config.load_kube_config(config_file=args.kubeconfig)
    v1 = client.CoreV1Api()
    name = None
    while True:
        try:
            if name is None:
                name = v1.list_namespaced_pod(args.namespace).items[0].metadata.name
            pod = v1.read_namespaced_pod(name, args.namespace)
            print("RENEWED", pod.metadata.resource_version, flush=True)
        except Exception as e:  # noqa: BLE001 - any failure: try again
            print(f"ERROR {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            time.sleep(1)
            continue
        time.sleep(args.interval)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        pass
