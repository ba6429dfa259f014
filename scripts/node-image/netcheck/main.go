// Command netcheck checks pod networking from inside a pod.
//
//	netcheck serve ADDR       answer every HTTP request with this pod's name
//	netcheck get URL [URL...] fetch each URL (bounded retries); exit 0 only if every
//	                          one gave an HTTP answer, any status
//
// get writes one line per URL to stdout and to /dev/termination-log, where the
// kubelet puts it into the pod's status: the answer is readable through the API
// even when nothing can reach the kubelet's log endpoint. TLS certificates are not
// verified: the question is whether the address answers, not whom to trust.
package main

import (
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"
)

const (
	attempts = 30
	pause    = time.Second
)

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: netcheck serve ADDR | netcheck get URL [URL...]")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "serve":
		serve(os.Args[2])
	case "get":
		os.Exit(get(os.Args[2:]))
	default:
		fmt.Fprintf(os.Stderr, "netcheck: unknown command %q\n", os.Args[1])
		os.Exit(2)
	}
}

func serve(addr string) {
	host, _ := os.Hostname()
	http.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, "netcheck %s\n", host)
	})
	fmt.Printf("netcheck: serving on %s\n", addr)
	server := &http.Server{Addr: addr, ReadHeaderTimeout: 10 * time.Second}
	if err := server.ListenAndServe(); err != nil {
		fmt.Fprintf(os.Stderr, "netcheck: %v\n", err)
		os.Exit(1)
	}
}

// get fetches every URL, each up to `attempts` times (a Service's rules may
// reach the node a moment after the pod starts); returns the exit code.
func get(urls []string) int {
	client := &http.Client{
		Timeout: 5 * time.Second,
		Transport: &http.Transport{
			TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // reachability only
		},
	}
	var lines []string
	code := 0
	for _, url := range urls {
		line := ""
		for i := 1; i <= attempts; i++ {
			resp, err := client.Get(url)
			if err == nil {
				body, _ := io.ReadAll(io.LimitReader(resp.Body, 200))
				resp.Body.Close()
				line = fmt.Sprintf("%s %d %s", url, resp.StatusCode, strings.TrimSpace(string(body)))
				break
			}
			line = fmt.Sprintf("%s error after %d attempts: %v", url, i, err)
			if i < attempts {
				time.Sleep(pause)
			}
		}
		if strings.Contains(line, " error after ") {
			code = 1
		}
		fmt.Println(line)
		lines = append(lines, line)
	}
	// Best effort: the file exists only in a container whose pod asks for it.
	_ = os.WriteFile("/dev/termination-log", []byte(strings.Join(lines, "\n")+"\n"), 0o644)
	return code
}
