// informer: a client-go shared informer (trixie's golang-k8s-client-go-dev, client-go 0.32,
// built with go1.24 in GOPATH mode by `cargo xtask setup`, xtask/src/informer.rs) beside the
// Kubernetes 1.20 components of the real-cluster tier. One SharedInformerFactory lists and
// watches ConfigMaps and Secrets in all namespaces, re-watching as client-go does (every 5–10
// min). It prints `SYNCED` once both caches are filled, and only counts: never an object.
// With --pods it lists and watches Pods instead, and prints one line per add, update or delete
// (the streams bench, xtask/src/bench/streams.rs, counts them), never an object either.
//
//	informer [--pods] --kubeconfig PATH   (or KUBECONFIG=PATH informer)
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
)

func main() {
	kubeconfig := flag.String("kubeconfig", os.Getenv("KUBECONFIG"), "the kubeconfig to use")
	pods := flag.Bool("pods", false, "watch Pods, printing a line per event")
	flag.Parse()
	if *kubeconfig == "" {
		fail(fmt.Errorf("no --kubeconfig and no KUBECONFIG"))
	}
	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fail(err)
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		fail(err)
	}
	factory := informers.NewSharedInformerFactory(client, 0)
	if *pods {
		watchPods(factory)
		return
	}
	configMaps := factory.Core().V1().ConfigMaps().Informer()
	secrets := factory.Core().V1().Secrets().Informer()
	stop := make(chan struct{})
	factory.Start(stop)
	if !cache.WaitForCacheSync(stop, configMaps.HasSynced, secrets.HasSynced) {
		fail(fmt.Errorf("the caches did not sync"))
	}
	fmt.Printf("SYNCED configmaps=%d secrets=%d\n",
		len(configMaps.GetStore().ListKeys()), len(secrets.GetStore().ListKeys()))
	waitForSignal()
	close(stop)
	factory.Shutdown()
}

// watchPods runs a Pod informer until SIGTERM or SIGINT, printing `add`, `update` or `delete`
// per event (the initial list's adds too) and `SYNCED pods=N` once its cache is filled.
func watchPods(factory informers.SharedInformerFactory) {
	pods := factory.Core().V1().Pods().Informer()
	if _, err := pods.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(interface{}) { fmt.Println("add") },
		UpdateFunc: func(interface{}, interface{}) { fmt.Println("update") },
		DeleteFunc: func(interface{}) { fmt.Println("delete") },
	}); err != nil {
		fail(err)
	}
	stop := make(chan struct{})
	factory.Start(stop)
	if !cache.WaitForCacheSync(stop, pods.HasSynced) {
		fail(fmt.Errorf("the cache did not sync"))
	}
	fmt.Printf("SYNCED pods=%d\n", len(pods.GetStore().ListKeys()))
	waitForSignal()
	close(stop)
	factory.Shutdown()
}

func waitForSignal() {
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	<-signals
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "informer:", err)
	os.Exit(1)
}
