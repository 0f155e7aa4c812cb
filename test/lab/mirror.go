package lab

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// mirrors are the Debian archives this machine's apt uses, read from its sources at run time so
// that no mirror host is ever written into the repository.
type mirrors struct {
	Archive  string // e.g. http://HOST/debian
	Security string // e.g. http://HOST/debian-security; empty when the machine has none
}

// The machine's apt sources.
const (
	sourcesList = "/etc/apt/sources.list"
	sourcesDir  = "/etc/apt/sources.list.d"
)

// aptSource is one enabled source: a URI and its suites.
type aptSource struct {
	URI    string
	Suites []string
}

// machineMirrors reads the machine's apt sources (sources.list and the *.list and *.sources
// files beside it, skipping disabled ones) and picks its Debian archive and security mirrors.
func machineMirrors() (mirrors, error) {
	var srcs []aptSource
	add := func(path string, parse func(string) []aptSource) error {
		b, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		srcs = append(srcs, parse(string(b))...)
		return nil
	}
	if err := add(sourcesList, parseSourcesList); err != nil {
		return mirrors{}, err
	}
	ents, err := os.ReadDir(sourcesDir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return mirrors{}, err
	}
	for _, e := range ents { // sorted by name, as apt reads them
		path := filepath.Join(sourcesDir, e.Name())
		switch filepath.Ext(e.Name()) {
		case ".list":
			err = add(path, parseSourcesList)
		case ".sources":
			err = add(path, parseDeb822)
		}
		if err != nil {
			return mirrors{}, err
		}
	}
	return pickMirrors(srcs)
}

// pickMirrors chooses the archive (the first source with a release suite such as bookworm, one
// without a dash) and the security archive (the first with a -security suite). The lab's
// apt-cacher-ng proxies plain HTTP only.
func pickMirrors(srcs []aptSource) (mirrors, error) {
	var m mirrors
	for _, s := range srcs {
		for _, suite := range s.Suites {
			switch {
			case m.Archive == "" && !strings.Contains(suite, "-") && !strings.Contains(suite, "/"):
				m.Archive = s.URI
			case m.Security == "" && strings.HasSuffix(suite, "-security"):
				m.Security = s.URI
			}
		}
	}
	if m.Archive == "" {
		return m, fmt.Errorf("no Debian archive in %s or %s: the lab takes its mirror from the machine's apt sources", sourcesList, sourcesDir)
	}
	for _, u := range []string{m.Archive, m.Security} {
		if u != "" && !strings.HasPrefix(u, "http://") {
			return m, fmt.Errorf("the machine's Debian mirror %s is not plain HTTP, which the lab's apt-cacher-ng needs", u)
		}
	}
	return m, nil
}

// parseSourcesList parses one-line-style sources: "deb [options] URI SUITE COMPONENT...".
func parseSourcesList(text string) []aptSource {
	var out []aptSource
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line, _, _ := strings.Cut(sc.Text(), "#")
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "deb" {
			continue
		}
		f = f[1:]
		if len(f) > 0 && strings.HasPrefix(f[0], "[") { // options, which may contain spaces
			for len(f) > 0 && !strings.HasSuffix(f[0], "]") {
				f = f[1:]
			}
			if len(f) > 0 {
				f = f[1:]
			}
		}
		if len(f) >= 2 {
			out = append(out, aptSource{URI: strings.TrimSuffix(f[0], "/"), Suites: f[1:2]})
		}
	}
	return out
}

// parseDeb822 parses deb822-style sources: stanzas of "Field: value" separated by blank lines.
func parseDeb822(text string) []aptSource {
	var out []aptSource
	flush := func(st map[string]string) {
		if !strings.EqualFold(st["enabled"], "no") && slices.Contains(strings.Fields(st["types"]), "deb") {
			for _, u := range strings.Fields(st["uris"]) {
				out = append(out, aptSource{URI: strings.TrimSuffix(u, "/"), Suites: strings.Fields(st["suites"])})
			}
		}
	}
	st := map[string]string{}
	last := ""
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "#"):
		case strings.TrimSpace(line) == "":
			flush(st)
			st, last = map[string]string{}, ""
		case line[0] == ' ' || line[0] == '\t': // a continuation line
			if last != "" {
				st[last] += " " + strings.TrimSpace(line)
			}
		default:
			k, v, ok := strings.Cut(line, ":")
			if ok {
				last = strings.ToLower(strings.TrimSpace(k))
				st[last] = strings.TrimSpace(v)
			}
		}
	}
	flush(st)
	return out
}
