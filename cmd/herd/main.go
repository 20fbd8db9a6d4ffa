// Command herd is the single herd binary: `herd server` runs a node,
// every other command administers the cluster through any node.
package main

import (
	"os"

	"github.com/herd-storage/herd/internal/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr))
}
