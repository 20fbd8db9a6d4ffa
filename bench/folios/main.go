// Command folios measures what the size of a buffered write does to later
// small writes into the same range: files laid out like herd's object
// files (data 4 KiB aligned after a header and checksum table) are written
// sequentially in pieces of each size given, then overwritten with random
// 4 KiB writes, and the CPU time (user + system) of both phases is
// printed per MiB and per 4 KiB write. On Linux with large folios (6.x,
// ext4), the page cache keeps a write's data in folios as large as the
// write, and a small write into a large folio costs more than one into a
// small one; internal/store writes data in pieces of dataWriteChunk.
//
//	go run ./bench/folios --dir /var/tmp/folios --pieces 4K,128K,1M
package main

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/herd-storage/herd/internal/size"
)

const (
	objectSize = 4 << 20
	dataOffset = 266240 // internal/store: header 4 KiB + checksum table 256 KiB
	block      = 4096
)

func main() {
	dir := flag.String("dir", "/var/tmp/herd-folios", "directory for the files (removed and made again for every piece size)")
	files := flag.Int("files", 256, "object files (4 MiB of data each)")
	pieceList := flag.String("pieces", "4K,64K,128K,256K,1M", "sizes of the sequential writes, comma-separated")
	writes := flag.Int("writes", 100000, "random 4 KiB writes after the sequential ones")
	rounds := flag.Int("rounds", 2, "times to run every piece size, alternating")
	flag.Parse()
	var pieces []int
	for _, p := range strings.Split(*pieceList, ",") {
		n, err := size.Parse(p)
		if err != nil || n < block || n > objectSize || n%block != 0 {
			fmt.Fprintf(os.Stderr, "folios: bad piece size %q: want a multiple of 4K up to 4M\n", p)
			os.Exit(2)
		}
		pieces = append(pieces, int(n))
	}
	fmt.Printf("%-8s %-5s %16s %16s\n", "piece", "round", "seq CPU us/MiB", "4K CPU us/write")
	for round := 1; round <= *rounds; round++ {
		for _, piece := range pieces {
			seq, random, err := run(*dir, *files, piece, *writes)
			if err != nil {
				fmt.Fprintln(os.Stderr, "folios:", err)
				os.Exit(1)
			}
			fmt.Printf("%-8s %-5d %16.0f %16.2f\n", size.Format(uint64(piece)), round, seq, random)
		}
	}
}

// run writes the files in pieces, syncs them, then overwrites random
// blocks; it returns the CPU microseconds per MiB written sequentially and
// per random write.
func run(dir string, files, piece, writes int) (float64, float64, error) {
	if err := os.RemoveAll(dir); err != nil {
		return 0, 0, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return 0, 0, err
	}
	defer os.RemoveAll(dir)
	handles := make([]*os.File, files)
	for i := range handles {
		f, err := os.OpenFile(filepath.Join(dir, fmt.Sprint(i)), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return 0, 0, err
		}
		defer f.Close()
		handles[i] = f
	}
	data := make([]byte, piece)
	for i := range data {
		data[i] = byte(i*7 + 1)
	}
	start := cpu()
	for _, f := range handles {
		for off := 0; off < objectSize; off += piece {
			if _, err := f.WriteAt(data, int64(dataOffset+off)); err != nil {
				return 0, 0, err
			}
		}
	}
	seq := float64(cpu()-start) / float64(time.Microsecond) / float64(files*objectSize>>20)
	for _, f := range handles {
		if err := f.Sync(); err != nil {
			return 0, 0, err
		}
	}
	start = cpu()
	for range writes {
		f := handles[rand.IntN(files)]
		if _, err := f.WriteAt(data[:block], int64(dataOffset+rand.IntN(objectSize/block)*block)); err != nil {
			return 0, 0, err
		}
	}
	random := float64(cpu()-start) / float64(time.Microsecond) / float64(writes)
	return seq, random, nil
}

// cpu is the process's user + system time so far.
func cpu() time.Duration {
	var usage syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &usage)
	return time.Duration(usage.Utime.Nano() + usage.Stime.Nano())
}
