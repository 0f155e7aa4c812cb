package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// What kip's reports (status, doctor, platform versions) print on stdout, in one shape.

// WriteList writes a report's titled list, "\nTitle" then one "  <glyph> item" line each, and
// nothing when items is empty.
func WriteList(w io.Writer, title, glyph string, items []string) {
	if len(items) == 0 {
		return
	}
	fmt.Fprintln(w, "\n"+title)
	for _, s := range items {
		fmt.Fprintf(w, "  %s %s\n", glyph, s)
	}
}

// WriteJSON writes v as -o json output: indented two spaces, with a final newline.
func WriteJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// WriteTable writes a report's titled table: "\nTitle", then header and rows in aligned columns,
// indented two spaces; "  " + empty alone when there are no rows.
func WriteTable(w io.Writer, title, empty string, header []string, rows [][]string) {
	fmt.Fprintln(w, "\n"+title)
	if len(rows) == 0 {
		fmt.Fprintln(w, "  "+empty)
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, r := range append([][]string{header}, rows...) {
		fmt.Fprintln(tw, "  "+strings.Join(r, "\t"))
	}
	tw.Flush()
}

// OrDash is s, or "-" when it is empty: a table's unknown cell.
func OrDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// Count is n with the word it counts: "1 copy", "3 copies".
func Count(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

// OrNone is s, or "none" when it is empty.
func OrNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}
