package testcluster

import (
	"bufio"
	"fmt"
	"io"
	"strings"
)

// A herd binary built with -race (see BinaryVariable) writes each data race
// it detects to its standard error, which is the node's log, and goes on
// running: nothing else would notice, since the test kills its nodes with
// SIGKILL before they could exit with the race detector's status 66. So the
// cleanup reads every node's log and fails the test on a race report.
const (
	// raceReportStart is the line that starts every race report; the line
	// before it and the line that ends it are raceReportFrame.
	raceReportStart = "WARNING: DATA RACE"
	raceReportFrame = "=================="
	// raceExcerptLines bounds the excerpt of a report a failure prints.
	raceExcerptLines = 120
)

// raceReports reads a log and returns the number of race reports in it and
// an excerpt of the first: from its first line to the line that closes it,
// at most raceExcerptLines lines.
func raceReports(log io.Reader) (count int, first string, err error) {
	reader := bufio.NewReaderSize(log, 64<<10)
	var excerpt []string
	inFirst := false
	for {
		line, readError := reader.ReadString('\n')
		if readError != nil && readError != io.EOF {
			return count, strings.Join(excerpt, "\n"), fmt.Errorf("testcluster: reading a node log: %w", readError)
		}
		if line == "" && readError == io.EOF {
			return count, strings.Join(excerpt, "\n"), nil
		}
		line = strings.TrimRight(line, "\n")
		if strings.HasPrefix(line, raceReportStart) {
			count++
			if count == 1 {
				inFirst = true
				excerpt = append(excerpt, raceReportFrame, line)
				continue
			}
		}
		if inFirst {
			if len(excerpt) < raceExcerptLines {
				excerpt = append(excerpt, line)
			}
			if line == raceReportFrame {
				inFirst = false
			}
		}
	}
}
