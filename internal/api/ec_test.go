package api

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/cluster/statemachine"
)

// TestCreateVDIRequestTakesEC: POST /v1/vdis reads "ec" (its body is
// decoded strictly: a field the request type lacks is refused).
func TestCreateVDIRequestTakesEC(t *testing.T) {
	r := httptest.NewRequest(http.MethodPost, "/v1/vdis", strings.NewReader(`{"name":"db","size":1073741824,"ec":"4+2"}`))
	var req CreateVDIRequest
	if err := decodeBody(r, &req); err != nil || req.EC != "4+2" || req.Copies != 0 {
		t.Fatalf("decoded %+v, %v", req, err)
	}
}

// TestCreateVDIErasureCodingRefusals: what a create of an erasure-coded
// VDI is refused with, as the admin API answers it (status, code,
// message) and as a client rebuilds it (it still matches the sentinel).
func TestCreateVDIErasureCodingRefusals(t *testing.T) {
	l := cluster.NewLocal()
	defer l.Close()
	for _, id := range []string{"a", "b", "c"} {
		if _, err := l.NodeJoin(cluster.Node{ID: id, Incarnation: "1"}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := l.Format(3, cluster.MinObjectSize); err != nil {
		t.Fatal(err)
	}
	if _, err := l.FinalizeUpgrade(cluster.LevelErasureCoding); err != nil {
		t.Fatal(err)
	}
	commands := statemachine.NewCommands(nil, nil, "a", "1") // refuses before it proposes
	_, bothErr := commands.CreateVDI(t.Context(), "db", 1<<30, false, 3, "4+2", nil)
	create := func(scheme string) error {
		_, err := l.CreateVDIWithScheme("db", 1<<30, false, scheme)
		return err
	}
	for _, c := range []struct {
		what     string
		err      error
		status   int
		sentinel error
		message  string
	}{
		{"too few nodes", create("4+2"), http.StatusConflict, cluster.ErrTooFewNodes,
			"not enough nodes: erasure coding 4+2 needs 6 nodes, the cluster has 3 (start more nodes, or use a scheme of fewer chunks)"},
		{"no parity", create("4+0"), http.StatusBadRequest, cluster.ErrInvalid,
			"invalid argument: ec: invalid scheme 4+0: M (parity chunks) must be 1..3, not 0"},
		{"too many data chunks", create("9+1"), http.StatusBadRequest, cluster.ErrInvalid,
			"invalid argument: ec: invalid scheme 9+1: K (data chunks) must be 2..8, not 9"},
		{"not a scheme", create("x"), http.StatusBadRequest, cluster.ErrInvalid,
			`invalid argument: ec: invalid scheme "x": want K+M data and parity chunks, as in "4+2"`},
		{"copies too", bothErr, http.StatusBadRequest, cluster.ErrInvalid,
			"invalid argument: copies 3 and erasure coding 4+2 cannot be asked for together: an erasure-coded VDI keeps M+1 copies of its map objects and recent writes by itself"},
	} {
		w := httptest.NewRecorder()
		writeError(w, c.err)
		var answer ErrorResponse
		if err := json.Unmarshal(w.Body.Bytes(), &answer); err != nil {
			t.Fatalf("%s: answer %q: %v", c.what, w.Body.String(), err)
		}
		if w.Code != c.status || answer.Error != c.message {
			t.Errorf("%s: %d %q, want %d %q", c.what, w.Code, answer.Error, c.status, c.message)
		}
		if remote := cluster.ErrorFromCode(answer.Code, answer.Error); !errors.Is(remote, c.sentinel) {
			t.Errorf("%s: code %q does not match %v at the client", c.what, answer.Code, c.sentinel)
		}
	}
}
