package control

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
)

// Format writes a response's data for a person: an object as aligned
// "key  value" lines (nested objects flattened with dots), an array of
// objects as a table whose columns are the union of their keys, and
// anything else as indented JSON.
func Format(w io.Writer, data json.RawMessage) error {
	var v any
	if err := json.Unmarshal(data, &v); err != nil {
		return fmt.Errorf("format: %w", err)
	}
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	switch v := v.(type) {
	case map[string]any:
		flat := map[string]string{}
		flatten("", v, flat)
		keys := sortedKeys(flat)
		for _, k := range keys {
			fmt.Fprintf(tw, "%s\t%s\n", k, flat[k])
		}
	case []any:
		rows := make([]map[string]string, 0, len(v))
		cols := map[string]bool{}
		for _, e := range v {
			m, ok := e.(map[string]any)
			if !ok {
				return indent(w, data)
			}
			flat := map[string]string{}
			flatten("", m, flat)
			for k := range flat {
				cols[k] = true
			}
			rows = append(rows, flat)
		}
		if len(rows) == 0 {
			fmt.Fprintln(tw, "(none)")
			break
		}
		order := sortedKeys(cols)
		fmt.Fprintln(tw, strings.ToUpper(strings.Join(order, "\t")))
		for _, r := range rows {
			vals := make([]string, len(order))
			for i, c := range order {
				vals[i] = r[c]
			}
			fmt.Fprintln(tw, strings.Join(vals, "\t"))
		}
	default:
		return indent(w, data)
	}
	return tw.Flush()
}

func indent(w io.Writer, data json.RawMessage) error {
	var b strings.Builder
	var v any
	_ = json.Unmarshal(data, &v)
	out, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	b.Write(out)
	b.WriteByte('\n')
	_, err = io.WriteString(w, b.String())
	return err
}

func flatten(prefix string, m map[string]any, out map[string]string) {
	for k, v := range m {
		key := k
		if prefix != "" {
			key = prefix + "." + k
		}
		switch v := v.(type) {
		case map[string]any:
			flatten(key, v, out)
		case float64:
			out[key] = strings.TrimSuffix(strings.TrimRight(fmt.Sprintf("%.6f", v), "0"), ".")
		case nil:
			out[key] = "-"
		default:
			if s, ok := v.(string); ok {
				out[key] = s
			} else {
				b, _ := json.Marshal(v)
				out[key] = string(b)
			}
		}
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
