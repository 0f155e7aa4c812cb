package mover

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"reflect"
	"strings"
	"testing"
)

func bigReport() *Report {
	r := &Report{Format: ReportFormat, Op: OpVerify, Result: Differ, Source: "/original", Target: "/copy",
		Totals: Totals{Files: 150000, Directories: 1500, Bytes: 600 << 20}, Seconds: 12.5, Workers: 8,
		DifferenceCount: 5000, Error: strings.Repeat("é", 3000)}
	for i := range DefaultMaxDifferences {
		r.Differences = append(r.Differences, Difference{Path: strings.Repeat("deep/", 20) + hex.EncodeToString([]byte{byte(i)}),
			Kind: Changed, Attribute: "content", Original: "sha256 " + strings.Repeat("a", 64), Copy: "sha256 " + strings.Repeat("b", 64)})
	}
	return r
}

func TestTerminationFitsAndPointsAtTheFullReport(t *testing.T) {
	r := bigReport()
	full := r.Line()
	msg := r.Termination(full)
	if len(msg) >= TerminationLimit {
		t.Fatalf("termination message of %d bytes, over %d", len(msg), TerminationLimit)
	}
	short, err := Decode(msg)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(full)
	if short.Digest != hex.EncodeToString(sum[:]) || short.Omitted == 0 || !short.Shortened || len(short.Differences) == 0 ||
		short.Differences[0] != r.Differences[0] || short.DifferenceCount != r.DifferenceCount || short.Totals != r.Totals {
		t.Errorf("termination message %+v does not keep the totals, the first differences and the full report's digest", short)
	}
	if !strings.HasPrefix(short.Error, "éé") || !strings.HasSuffix(short.Error, "…") {
		t.Errorf("the error was not cut to fit at a character: %.40q…", short.Error)
	}
	log := append([]byte("copy: 10 entries so far\nverify differences: …\n"), append(full, '\n')...)
	got, err := FindFull(log, short.Digest)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, r) {
		t.Errorf("the full report from the log differs from the one written")
	}
	if _, err := FindFull(log[:len(log)-10], short.Digest); err == nil {
		t.Error("FindFull accepted a cut log")
	}
}

func TestDecodeRefuses(t *testing.T) {
	for _, in := range []string{
		``, `{}`, `[]`, `{"format":2,"op":"copy","result":"done"}`, `{"format":1,"op":"move","result":"done"}`,
		`{"format":1,"op":"copy","result":"fine"}`, `{"format":1,"op":"copy","result":"done","extra":1}`,
		`{"format":1,"op":"copy","result":"done"} {}`,
		`{"format":1,"op":"verify","result":"differences","differences":[{"path":"a","kind":"odd"}],"differenceCount":1}`,
		`{"format":1,"op":"verify","result":"differences","differences":[{"path":"a","kind":"extra"}]}`,
	} {
		if r, err := Decode([]byte(in)); err == nil {
			t.Errorf("Decode(%q) = %+v, want an error", in, r)
		}
	}
}

// FuzzDecode: Decode never panics, and whatever it accepts is a report that encodes and decodes to
// itself, whose termination message fits and decodes too.
func FuzzDecode(f *testing.F) {
	small := bigReport()
	small.Differences, small.Error = small.Differences[:30], "x"
	f.Add(small.Line())
	f.Add([]byte(`{"format":1,"op":"copy","result":"out-of-space","error":"write /copy/x: no space left on device"}`))
	f.Add([]byte(`{"format":1,"op":"scan","result":"done","totals":{"files":3,"directories":1,"bytes":12}}`))
	f.Add([]byte(`{"format":1,"op":"verify","result":"differences","differences":[{"path":"a","kind":"missing","original":"FIFO"}],"differenceCount":1,"omitted":0,"digest":"00"}`))
	f.Add([]byte(`{"format":1,"op":"copy","result":"error","source":"` + strings.Repeat(`\u0001`, 300) + `","target":"` + strings.Repeat(`\u0002`, 300) + `","error":"` + strings.Repeat(`\u0003`, 300) + `"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := Decode(b)
		if err != nil {
			return
		}
		line := r.Line()
		again, err := Decode(line)
		if err != nil {
			t.Fatalf("a decoded report does not decode again: %v\n%s", err, line)
		}
		if !bytes.Equal(again.Line(), line) {
			t.Fatalf("a report changed through encoding:\n%s\n%s", line, again.Line())
		}
		msg := r.Termination(line)
		if len(msg) >= TerminationLimit {
			t.Fatalf("termination message of %d bytes", len(msg))
		}
		if _, err := Decode(msg); err != nil {
			t.Fatalf("termination message does not decode: %v\n%s", err, msg)
		}
	})
}
