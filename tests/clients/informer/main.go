// informer: a client-go shared informer (trixie's golang-k8s-client-go-dev, client-go 0.32,
// built with go1.24 in GOPATH mode by `cargo xtask setup`, xtask/src/informer.rs) beside the
// Kubernetes 1.20 components of the real-cluster tier. One SharedInformerFactory lists and
// watches ConfigMaps and Secrets in all namespaces, re-watching as client-go does (every 5–10
// min). It prints `SYNCED` once both caches are filled, and only counts: never an object.
//
//	informer --kubeconfig PATH   (or KUBECONFIG=PATH informer)
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
	configMaps := factory.Core().V1().ConfigMaps().Informer()
	secrets := factory.Core().V1().Secrets().Informer()
	stop := make(chan struct{})
	factory.Start(stop)
	if !cache.WaitForCacheSync(stop, configMaps.HasSynced, secrets.HasSynced) {
		fail(fmt.Errorf("the caches did not sync"))
	}
	fmt.Printf("SYNCED configmaps=%d secrets=%d\n",
		len(configMaps.GetStore().ListKeys()), len(secrets.GetStore().ListKeys()))
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	<-signals
	close(stop)
	factory.Shutdown()
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "informer:", err)
	os.Exit(1)
}
