// A tiles client that is not fak's code: it verifies a log fak serves per C2SP tlog-tiles with
// Go's golang.org/x/mod/sumdb/tlog and sumdb/note (tests/audit/test_audit_tiles_go.py builds and runs it).
//
// Usage: tlog_client PREFIX VKEY ENTRY LEAF_FILE   (API key in $FAK_KEY)
// It checks the checkpoint's signature with the pinned VKEY, the tree hash from the hash tiles,
// and the inclusion of entry ENTRY whose leaf data is LEAF_FILE's bytes; it prints "ok SIZE".
package main

import (
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"

	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

func get(url string) ([]byte, error) {
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+os.Getenv("FAK_KEY"))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != 200 {
		return nil, fmt.Errorf("GET %s: HTTP %d", url, resp.StatusCode)
	}
	return body, nil
}

// tiles maps Go's tile paths (tile/H/L/N, tile/H/data/N) to C2SP's (tile/L/N, tile/entries/N).
type tiles struct{ prefix string }

func (t tiles) Height() int { return 8 }

func (t tiles) ReadTiles(ts []tlog.Tile) ([][]byte, error) {
	out := make([][]byte, len(ts))
	for i, tile := range ts {
		path := strings.TrimPrefix(tile.Path(), "tile/8/")
		if strings.HasPrefix(path, "data/") {
			path = "entries/" + strings.TrimPrefix(path, "data/")
		}
		data, err := get(t.prefix + "/tile/" + path)
		if err != nil {
			return nil, err
		}
		out[i] = data
	}
	return out, nil
}

func (t tiles) SaveTiles([]tlog.Tile, [][]byte) {}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
	os.Exit(1)
}

func main() {
	if len(os.Args) != 5 {
		fail("usage: tlog_client PREFIX VKEY ENTRY LEAF_FILE")
	}
	prefix, vkey := os.Args[1], os.Args[2]
	entry, err := strconv.ParseInt(os.Args[3], 10, 64)
	if err != nil {
		fail("entry: %v", err)
	}
	leaf, err := os.ReadFile(os.Args[4])
	if err != nil {
		fail("leaf: %v", err)
	}
	verifier, err := note.NewVerifier(vkey)
	if err != nil {
		fail("verifier key: %v", err)
	}
	raw, err := get(prefix + "/checkpoint")
	if err != nil {
		fail("checkpoint: %v", err)
	}
	n, err := note.Open(raw, note.VerifierList(verifier))
	if err != nil {
		fail("checkpoint signature: %v", err)
	}
	lines := strings.Split(n.Text, "\n")
	if len(lines) < 3 {
		fail("checkpoint body: %q", n.Text)
	}
	size, err := strconv.ParseInt(lines[1], 10, 64)
	if err != nil {
		fail("checkpoint size: %v", err)
	}
	root, err := base64.StdEncoding.DecodeString(lines[2])
	if err != nil || len(root) != tlog.HashSize {
		fail("checkpoint root: %q", lines[2])
	}
	var tree tlog.Tree
	tree.N = size
	copy(tree.Hash[:], root)
	reader := tlog.TileHashReader(tree, tiles{prefix})
	h, err := tlog.TreeHash(tree.N, reader)
	if err != nil {
		fail("tree hash from the tiles: %v", err)
	}
	if h != tree.Hash {
		fail("tree hash from the tiles %v != checkpoint root %v", h, tree.Hash)
	}
	proof, err := tlog.ProveRecord(tree.N, entry, reader)
	if err != nil {
		fail("inclusion proof of %d: %v", entry, err)
	}
	if err := tlog.CheckRecord(proof, tree.N, tree.Hash, entry, tlog.RecordHash(leaf)); err != nil {
		fail("inclusion of %d: %v", entry, err)
	}
	fmt.Printf("ok %d\n", size)
}
