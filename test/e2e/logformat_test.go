package e2e

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/testcluster"
)

// TestJSONLogIsOneStream: with --log-format json every line a node writes
// is one JSON object (time, level, msg), raft's and gossip's lines
// included, tagged with their component. A voter is killed so that raft
// and gossip have something to say.
func TestJSONLogIsOneStream(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Nodes: 3, ExtraArgs: []string{"--log-format", "json"}})
	waitAgreement(t, c, []int{0, 1, 2}, 30*time.Second)
	c.Node(2).Kill()
	components := map[string]int{}
	testcluster.WaitFor(t, 60*time.Second, "raft's lines in the survivors' JSON logs", func() (bool, error) {
		clear(components)
		for _, node := range []int{0, 1} {
			if err := jsonLines(c.Node(node).LogPath(), components); err != nil {
				return false, err
			}
		}
		return components["raft"] > 0, fmt.Errorf("components seen: %v", components)
	})
	t.Logf("JSON lines by component: %v", components)
}

// jsonLines checks that every line of a node's log (but testcluster's
// own "===" lines) is a JSON object with time, level and msg, and counts
// them by component ("" for herd's own).
func jsonLines(path string, components map[string]int) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	scanner := bufio.NewScanner(f)
	scanner.Buffer(make([]byte, 1<<20), 1<<20)
	for scanner.Scan() {
		line := scanner.Text()
		if line == "" || strings.HasPrefix(line, "=== testcluster") {
			continue
		}
		var record map[string]any
		if err := json.Unmarshal([]byte(line), &record); err != nil {
			return fmt.Errorf("%s: not a JSON line: %q", path, line)
		}
		for _, key := range []string{"time", "level", "msg"} {
			if _, ok := record[key]; !ok {
				return fmt.Errorf("%s: line without %q: %q", path, key, line)
			}
		}
		component, _ := record["component"].(string)
		msg, _ := record["msg"].(string)
		if strings.Contains(msg, "memberlist:") && component != "memberlist" {
			return errors.New(path + ": a memberlist line without component=memberlist: " + line)
		}
		components[component]++
	}
	return scanner.Err()
}
