// A client linked against net/http with HTTP/2 and crypto/tls, standard library only: the
// binary the gobin tests read. It never dials anything when run.
package main

import (
	"fmt"
	"net/http"
	"os"
)

// fetch is never called at run time; it only has to link the HTTP/2 client and TLS.
func fetch(url string) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	return resp.Body.Close()
}

func main() {
	if len(os.Args) > 2 {
		fmt.Println(fetch(os.Args[1]))
	}
}
