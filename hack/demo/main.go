// Command demo plays the whole autoconfig loop on one machine, with no
// cluster: a real kube-apiserver + etcd (the envtest binaries), the real
// `autoconfig controller` binary, the sample routes from deploy/samples,
// backends that scale out and in, and — where nginx with the lua module is
// installed — a real nginx data plane (the shipped
// deploy/openresty/nginx.conf) fed by the real `reload` sidecar binary,
// with requests through the video route reaching the new backends and
// requests through the llm route (the reference lua engine of
// deploy/openresty/lua) following scale-out and failing over when one
// backend refuses connections. A last llm route runs on simulated vLLM
// pods (internal/llmsim): multi-turn sessions stay on the pod that caches
// them, and with a decode SLO a burst of twice what the pods carry is
// admitted at the SLO's rate and the excess refused at once.
//
//	make demo            # or: go run ./hack/demo [-pause 2s] [-nginx auto|on|off]
//
// Everything runs under one temporary directory that is removed on exit or
// Ctrl-C; a second run starts from scratch.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// options are the demo's flags.
type options struct {
	// Pause is the time between scenes, so a person can read them.
	Pause time.Duration
	// Nginx is auto (run the data plane when nginx is installed), on
	// (require it) or off.
	Nginx string
	// Keep leaves the temporary directory in place (for a look at logs).
	Keep bool
	// Timeout bounds each wait for convergence.
	Timeout time.Duration
	// Autoconfig is a prebuilt autoconfig binary (default: build one).
	Autoconfig string
	// Converged, if set, runs after the scaling scenes (before the
	// routes are scaled to zero and deleted), with the /metrics URLs of the binaries by name
	// ("autoconfig", and "reload" with the nginx data plane).
	Converged func(metrics map[string]string) error
}

func (o *options) AddFlags(fs *flag.FlagSet) {
	fs.DurationVar(&o.Pause, "pause", 2*time.Second, "pause between scenes (0 = run straight through)")
	fs.StringVar(&o.Nginx, "nginx", "auto", "run a real nginx data plane: auto (when /usr/sbin/nginx and the lua module are installed), on, off")
	fs.BoolVar(&o.Keep, "keep", false, "keep the temporary directory (logs, kubeconfig, rendered files)")
	fs.DurationVar(&o.Timeout, "timeout", 90*time.Second, "bound of each wait for the controller to converge")
	fs.StringVar(&o.Autoconfig, "autoconfig", "", "use this autoconfig binary instead of building ./cmd/autoconfig")
}

func (o *options) Validate() error {
	switch o.Nginx {
	case "auto", "on", "off":
	default:
		return fmt.Errorf("-nginx %q: use auto, on or off", o.Nginx)
	}
	if o.Pause < 0 || o.Timeout <= 0 {
		return errors.New("-pause must be >= 0 and -timeout > 0")
	}
	return nil
}

func main() { os.Exit(runMain(os.Args[1:], os.Stdout, os.Stderr)) }

func runMain(args []string, stdout, stderr io.Writer) int {
	var o options
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if err := o.Validate(); err != nil {
		fmt.Fprintln(stderr, "demo:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, stdout, o); err != nil {
		if ctx.Err() != nil {
			fmt.Fprintln(stderr, "demo: interrupted; cleaned up")
			return 130
		}
		fmt.Fprintln(stderr, "demo:", err)
		return 1
	}
	return 0
}
