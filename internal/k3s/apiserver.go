package k3s

import (
	"bytes"
	"fmt"
	"slices"
	"strings"

	yaml "go.yaml.in/yaml/v3"
)

// apiServerArgKey is config.yaml's list of kube-apiserver arguments; k3s also reads a key with
// a trailing "+", which appends to it.
const apiServerArgKey = "kube-apiserver-arg"

// APIServerArgs is what a server's config.yaml says of the kube-apiserver arguments kip
// installs (Want): the block as it is, and what it lacks.
type APIServerArgs struct {
	// Have are the block's arguments, in order ("name=value"); Block reports that the file has
	// the key at all.
	Have  []string
	Block bool
	// Missing are the wanted arguments whose name the block does not carry.
	Missing []string
	// Custom reports a block kip cannot complete on its own: it holds an argument kip does not
	// write (or one of kip's names with another value) and lacks some of kip's. kip then prints
	// Missing and leaves the file to the operator.
	Custom bool
}

// Complete reports whether the block carries every wanted argument's name: the file is kept as
// it is, values and all (spec 002: the arguments themselves are not rewritten).
func (a APIServerArgs) Complete() bool { return len(a.Missing) == 0 }

// JudgeAPIServerArgs reads config's kube-apiserver-arg block against the arguments kip installs.
func JudgeAPIServerArgs(config []byte, want []string) (APIServerArgs, error) {
	root, err := parseConfig(config)
	if err != nil {
		return APIServerArgs{}, err
	}
	var a APIServerArgs
	appends := false
	for _, key := range []string{apiServerArgKey, apiServerArgKey + "+"} {
		v := mappingValue(root, key)
		if v == nil {
			continue
		}
		a.Block, appends = true, appends || strings.HasSuffix(key, "+")
		items, err := stringItems(v)
		if err != nil {
			return APIServerArgs{}, fmt.Errorf("%s: %s: %w", ConfigPath, key, err)
		}
		a.Have = append(a.Have, items...)
	}
	names := map[string]bool{}
	for _, arg := range a.Have {
		names[argName(arg)] = true
	}
	for _, w := range want {
		if !names[argName(w)] {
			a.Missing = append(a.Missing, w)
		}
	}
	// A block of kip's own arguments (an earlier run's, written while Dex did not answer) is
	// completed; any other block that lacks some is the operator's to edit.
	a.Custom = len(a.Missing) > 0 && (appends || slices.ContainsFunc(a.Have, func(arg string) bool { return !slices.Contains(want, arg) }))
	return a, nil
}

// argName is an argument's flag name: "audit-log-path" of "audit-log-path=/x" or "--audit-log-path=/x".
func argName(arg string) string {
	name, _, _ := strings.Cut(strings.TrimLeft(arg, "-"), "=")
	return name
}

// AddAPIServerArgs returns config with add appended to its kube-apiserver-arg block (the block
// made when there is none), everything else in the file kept, comments included.
func AddAPIServerArgs(config []byte, add []string) ([]byte, error) {
	root, err := parseConfig(config)
	if err != nil {
		return nil, err
	}
	items := make([]*yaml.Node, len(add))
	for i, arg := range add {
		items[i] = &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: arg}
	}
	switch v := mappingValue(root, apiServerArgKey); {
	case v == nil:
		root.Content = append(root.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: apiServerArgKey},
			&yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq", Content: items})
	case v.Kind == yaml.SequenceNode:
		v.Content = append(v.Content, items...)
	default: // a single argument as a string
		one := *v
		*v = yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq", Content: append([]*yaml.Node{&one}, items...)}
	}
	return encodeConfig(root)
}

// FlannelBackend is the flannel backend config names ("" when it names none).
func FlannelBackend(config []byte) (string, error) { return scalarKey(config, flannelBackendKey) }

// NodeIP is the node-ip config names ("" when it names none).
func NodeIP(config []byte) (string, error) { return scalarKey(config, "node-ip") }

// scalarKey is the value of a top-level scalar key of a config.yaml, "" when it has none.
func scalarKey(config []byte, key string) (string, error) {
	root, err := parseConfig(config)
	if err != nil {
		return "", err
	}
	if v := mappingValue(root, key); v != nil && v.Kind == yaml.ScalarNode {
		return v.Value, nil
	}
	return "", nil
}

// SetFlannelBackend returns config naming backend as its flannel backend, everything else in the
// file kept, comments included.
func SetFlannelBackend(config []byte, backend string) ([]byte, error) {
	return setKeys(config, flannelBackendKey, backend)
}

// SetNodeAddresses sets config.yaml's node-ip and node-external-ip, the rest of the file kept as
// SetFlannelBackend keeps it: the server's move onto a private network on its first private
// join.
func SetNodeAddresses(config []byte, nodeIP, externalIP string) ([]byte, error) {
	return setKeys(config, "node-ip", nodeIP, "node-external-ip", externalIP)
}

// setKeys sets top-level scalar keys of a config.yaml (key, value, key, value...), each in its
// place (its line comment kept) or appended. A file that already has every value is returned
// as it is, byte for byte.
func setKeys(config []byte, pairs ...string) ([]byte, error) {
	root, err := parseConfig(config)
	if err != nil {
		return nil, err
	}
	changed := false
	for i := 0; i+1 < len(pairs); i += 2 {
		value := &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: pairs[i+1]}
		v := mappingValue(root, pairs[i])
		if v != nil && v.Kind == yaml.ScalarNode && v.Value == pairs[i+1] {
			continue
		}
		changed = true
		if v != nil {
			value.LineComment = v.LineComment
			*v = *value
		} else {
			root.Content = append(root.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: pairs[i]}, value)
		}
	}
	if !changed {
		return config, nil
	}
	return encodeConfig(root)
}

// flannelBackendKey is config.yaml's flannel backend.
const flannelBackendKey = "flannel-backend"

// encodeConfig writes a config.yaml's top-level mapping back out.
func encodeConfig(root *yaml.Node) ([]byte, error) {
	var out bytes.Buffer
	enc := yaml.NewEncoder(&out)
	enc.SetIndent(2)
	doc := &yaml.Node{Kind: yaml.DocumentNode, Content: []*yaml.Node{root}}
	if err := enc.Encode(doc); err != nil {
		return nil, fmt.Errorf("write %s: %w", ConfigPath, err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("write %s: %w", ConfigPath, err)
	}
	return out.Bytes(), nil
}

// parseConfig parses a k3s config.yaml into its top-level mapping (an empty one for an empty
// file).
func parseConfig(config []byte) (*yaml.Node, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(config, &doc); err != nil {
		return nil, fmt.Errorf("%s is not YAML: %w", ConfigPath, err)
	}
	if doc.Kind == 0 { // empty
		return &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}, nil
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		return nil, fmt.Errorf("%s is not a YAML mapping of k3s's settings", ConfigPath)
	}
	return doc.Content[0], nil
}

// mappingValue is the value of key in the mapping m, nil when it has none.
func mappingValue(m *yaml.Node, key string) *yaml.Node {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}

// stringItems are the strings of a scalar or a sequence of scalars.
func stringItems(v *yaml.Node) ([]string, error) {
	switch v.Kind {
	case yaml.ScalarNode:
		return []string{v.Value}, nil
	case yaml.SequenceNode:
		var out []string
		for _, item := range v.Content {
			if item.Kind != yaml.ScalarNode {
				return nil, fmt.Errorf("line %d: an argument is not a string", item.Line)
			}
			out = append(out, item.Value)
		}
		return out, nil
	}
	return nil, fmt.Errorf("line %d: not a string or a list of strings", v.Line)
}
