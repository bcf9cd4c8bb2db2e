#!/usr/bin/python3
"""A python3-kubernetes controller whose HTTP/1.1 requests lifeline follows through libssl.

Run it with /usr/bin/python3 (Debian's python3-kubernetes is installed for that interpreter):

    /usr/bin/python3 py-streams.py --kubeconfig PATH
        --resource pods|namespaces|events --go-when PATH [--timeout-seconds N]
        [--create-event NAME] [--list-once --idle SECONDS]

As a controller does: it lists namespaces first, then waits until file PATH exists (lifeline
probes a client's libssl once the client is connected, so its first requests may go unseen:
the test creates PATH once lifeline says it follows the client), optionally creates
Event NAME in namespace default with message $PY_STREAMS_NOTE (in the request body) and
waits 2 s (its request stays the connection's last), then watches RESOURCE in all namespaces with `timeout_seconds=N` forever, printing `WATCH_START`, one line per event (`<TYPE> <name>`)
and `WATCH_END` when the server ends a watch. With `--list-once`, instead of watching: it
lists namespaces again (a small answer, with a Content-Length), prints `IDLE`, sleeps
SECONDS, prints `LIST_START`, lists RESOURCE in all namespaces once, prints `LIST_END` and
sleeps. $PY_STREAMS_TOKEN, when set, replaces the
kubeconfig's bearer token. (Secrets come through the environment: a command line is listed.)
"""
import argparse
import os
import time

from kubernetes import client, config, watch


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--resource", choices=["pods", "namespaces", "events"], required=True)
    parser.add_argument("--timeout-seconds", type=int, default=60)
    parser.add_argument("--create-event")
    parser.add_argument("--go-when", required=True)
    parser.add_argument("--list-once", action="store_true")
    parser.add_argument("--idle", type=float, default=0.0)
    args = parser.parse_args()
    token = os.environ.get("PY_STREAMS_TOKEN")
    note = os.environ.get("PY_STREAMS_NOTE", "")

    configuration = client.Configuration()
    config.load_kube_config(config_file=args.kubeconfig, client_configuration=configuration)
    if token:
        configuration.api_key = {"authorization": "Bearer " + token}
    v1 = client.CoreV1Api(client.ApiClient(configuration))
    v1.list_namespace()
    while not os.path.exists(args.go_when):
        time.sleep(0.05)
    if args.create_event:
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": args.create_event, "namespace": "default"},
            "involvedObject": {"kind": "Pod", "name": "web-0", "namespace": "default"},
            "reason": "Testing",
            "message": note,
            "type": "Normal",
        }
        v1.create_namespaced_event("default", body)
        print("CREATED", flush=True)
        time.sleep(2)
    resource = {
        "pods": v1.list_pod_for_all_namespaces,
        "namespaces": v1.list_namespace,
        "events": v1.list_event_for_all_namespaces,
    }[args.resource]
    if args.list_once:
        v1.list_namespace()
        print("IDLE", flush=True)
        time.sleep(args.idle)
        print("LIST_START", flush=True)
        resource()
        print("LIST_END", flush=True)
        while True:
            time.sleep(60)
    while True:
        print("WATCH_START", flush=True)
        for event in watch.Watch().stream(resource, timeout_seconds=args.timeout_seconds):
            print(event["type"], event["object"].metadata.name, flush=True)
        print("WATCH_END", flush=True)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        pass
