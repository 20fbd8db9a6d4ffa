package transfer

import (
	"fmt"
	"io"
	"sync/atomic"
	"time"

	"github.com/herd-storage/herd/internal/size"
)

// progress counts the bytes done and, on a terminal, redraws one line.
type progress struct {
	done    atomic.Uint64
	total   uint64 // 0: unknown (stdin)
	label   string
	started time.Time
	w       io.Writer
	stop    chan struct{}
	stopped chan struct{}
}

func (t *copier) startProgress(label string, total uint64) *progress {
	p := &progress{total: total, label: label, started: time.Now(), w: t.Progress}
	if p.w == nil {
		return p
	}
	p.stop, p.stopped = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(p.stopped)
		ticker := time.NewTicker(progressInterval)
		defer ticker.Stop()
		for {
			select {
			case <-ticker.C:
				p.draw()
			case <-p.stop:
				fmt.Fprint(p.w, "\r\033[K") // clear the line for the summary
				return
			}
		}
	}()
	return p
}

func (p *progress) add(n uint64) { p.done.Add(n) }

func (p *progress) draw() {
	done := p.done.Load()
	elapsed := time.Since(p.started).Seconds()
	rate := 0.0
	if elapsed > 0 {
		rate = float64(done) / elapsed
	}
	line := fmt.Sprintf("%s: %s", p.label, size.Format(done))
	if p.total > 0 {
		line += fmt.Sprintf(" / %s (%d%%)", size.Format(p.total), done*100/p.total)
	}
	line += fmt.Sprintf(", %s/s", size.Format(uint64(rate)))
	if p.total > 0 && rate > 0 && done < p.total {
		eta := time.Duration(float64(p.total-done) / rate * float64(time.Second)).Round(time.Second)
		line += ", ETA " + eta.String()
	}
	fmt.Fprintf(p.w, "\r%s\033[K", line)
}

func (p *progress) finish() {
	if p.stop != nil {
		close(p.stop)
		<-p.stopped
		p.stop = nil
	}
}
