// Command snapbench measures snapshot, clone, rollback and delete latency
// of VDIs with 1, 1,000 and 100,000 written objects, the time until a
// deleted VDI's objects are freed, and cloning 1,000 VMs from one golden
// image. It needs a running cluster formatted with 64 KiB objects (see
// bench/snapbench.sh) and nbdcopy to write the objects.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/herd-storage/herd/internal/api"
)

const objectSize = 64 << 10

func main() {
	addr := flag.String("addr", "127.0.9.1", "admin address of a node")
	nbdAddr := flag.String("nbd", "/var/tmp/herd-bench/cluster/node1/nbd.sock", "a node's local NBD socket")
	token := os.Getenv("HERD_TOKEN") // an admin token
	sizes := flag.String("objects", "1,1000,100000", "written objects per VDI")
	clones := flag.Int("clones", 1000, "VMs to clone from the golden image")
	flag.Parse()
	ctx := context.Background()
	c := api.NewClient(*addr, token)
	fail := func(err error) {
		if err != nil {
			fmt.Fprintln(os.Stderr, "snapbench:", err)
			os.Exit(1)
		}
	}
	timed := func(fn func() error) time.Duration {
		start := time.Now()
		fail(fn())
		return time.Since(start)
	}
	objectCount := func() uint64 {
		nodes, err := c.Nodes(ctx)
		fail(err)
		var n uint64
		for _, node := range nodes {
			n += node.Objects
		}
		return n
	}
	fmt.Printf("%-10s %12s %12s %12s %12s %14s %12s\n", "objects", "write", "snapshot", "clone", "rollback", "delete(commit)", "freed after")
	for _, text := range strings.Split(*sizes, ",") {
		n, err := strconv.Atoi(text)
		fail(err)
		name := fmt.Sprintf("sb%d", n)
		_, err = c.CreateVDI(ctx, name, uint64(max(n, 1))*objectSize)
		fail(err)
		write := timed(func() error { return writeObjects(*nbdAddr, name, n) })
		snapshot := timed(func() error { _, err := c.Snapshot(ctx, name, "s"); return err })
		clone := timed(func() error { _, err := c.Clone(ctx, name+"@s", name+"-clone"); return err })
		rollback := timed(func() error { _, err := c.Rollback(ctx, name, "s"); return err })
		before := objectCount()
		remove := timed(func() error {
			for _, v := range []string{name + "-clone", name, name + "@s"} {
				if err := c.DeleteVDI(ctx, v); err != nil {
					return err
				}
			}
			return nil
		})
		start := time.Now()
		for objectCount() > before-uint64(n)*3 && time.Since(start) < 10*time.Minute {
			time.Sleep(100 * time.Millisecond)
		}
		freed := time.Since(start) + remove
		fmt.Printf("%-10d %12v %12v %12v %12v %14v %12v\n", n, write.Round(time.Millisecond), snapshot.Round(time.Microsecond),
			clone.Round(time.Microsecond), rollback.Round(time.Microsecond), remove.Round(time.Microsecond), freed.Round(time.Millisecond))
	}
	if *clones > 0 {
		_, err := c.CreateVDI(ctx, "golden", 1000*objectSize)
		fail(err)
		fail(writeObjects(*nbdAddr, "golden", 1000))
		_, err = c.Snapshot(ctx, "golden", "base")
		fail(err)
		start := time.Now()
		var slowest time.Duration
		for i := 0; i < *clones; i++ {
			t := time.Now()
			_, err := c.Clone(ctx, "golden@base", fmt.Sprintf("vm%04d", i))
			fail(err)
			slowest = max(slowest, time.Since(t))
		}
		total := time.Since(start)
		fmt.Printf("cloned %d VMs from golden@base (1,000 objects) in %v: %v per clone, slowest %v\n",
			*clones, total.Round(time.Millisecond), (total / time.Duration(*clones)).Round(time.Microsecond), slowest.Round(time.Microsecond))
	}
}

// writeObjects writes 4 KiB into each of the first n objects of a VDI
// with nbdcopy (the zero rest of each object is skipped).
func writeObjects(nbdAddr, name string, n int) error {
	if n == 0 {
		return nil
	}
	dir, err := os.MkdirTemp("", "snapbench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	image := filepath.Join(dir, "image")
	f, err := os.Create(image)
	if err != nil {
		return err
	}
	block := []byte(strings.Repeat("herd", 1024))
	for i := 0; i < n; i++ {
		if _, err := f.WriteAt(block, int64(i)*objectSize); err != nil {
			return err
		}
	}
	f.Truncate(int64(n) * objectSize)
	f.Close()
	out, err := exec.Command("nbdcopy", "--flush", image, "nbd+unix:///"+name+"?socket="+nbdAddr).CombinedOutput()
	if err != nil {
		return fmt.Errorf("nbdcopy: %v: %s", err, out)
	}
	return nil
}
