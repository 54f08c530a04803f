// helm_render renders a Helm chart's templates as `helm template` does, for the chart tests where no helm
// binary installs (it is on none of PyPI, npm or Debian 12). It uses the libraries Helm's engine is made of,
// from Debian's Go packages: text/template, sprig's functions and ghodss/yaml (sigs.k8s.io/yaml's parent),
// plus Helm's own toYaml, include and required. What Helm adds beyond those (lookup, tpl, .Capabilities,
// subcharts, hooks) the chart does not use; a template that reaches for them fails here, loudly.
//
// Keys missing from the values are errors (missingkey=error, as `helm lint --strict`), so a chart that
// renders here also renders under helm's laxer default.
//
// Usage: helm_render CHART_DIR RELEASE NAMESPACE [VALUES_FILE ...]
package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/template"

	"github.com/Masterminds/sprig"
	"github.com/ghodss/yaml"
)

func readYaml(path string) map[string]interface{} {
	data, err := os.ReadFile(path)
	if err != nil {
		fail(err)
	}
	out := map[string]interface{}{}
	if err := yaml.Unmarshal(data, &out); err != nil {
		fail(fmt.Errorf("%s: %w", path, err))
	}
	return out
}

// merge lays src over dst as Helm's values files do: maps merge key by key, anything else replaces, and a
// null deletes the key.
func merge(dst, src map[string]interface{}) {
	for key, value := range src {
		if value == nil {
			delete(dst, key)
			continue
		}
		inner, isMap := value.(map[string]interface{})
		current, wasMap := dst[key].(map[string]interface{})
		if isMap && wasMap {
			merge(current, inner)
		} else {
			dst[key] = value
		}
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "helm_render:", err)
	os.Exit(1)
}

func main() {
	if len(os.Args) < 4 {
		fail(fmt.Errorf("usage: helm_render CHART_DIR RELEASE NAMESPACE [VALUES_FILE ...]"))
	}
	chartDir, release, namespace := os.Args[1], os.Args[2], os.Args[3]
	chart := readYaml(filepath.Join(chartDir, "Chart.yaml"))
	values := readYaml(filepath.Join(chartDir, "values.yaml"))
	for _, path := range os.Args[4:] {
		merge(values, readYaml(path))
	}

	root := template.New("chart").Option("missingkey=error")
	funcs := sprig.TxtFuncMap()
	delete(funcs, "env") // as Helm: a chart does not read the renderer's environment
	delete(funcs, "expandenv")
	funcs["toYaml"] = func(v interface{}) string {
		data, err := yaml.Marshal(v)
		if err != nil {
			return ""
		}
		return strings.TrimSuffix(string(data), "\n")
	}
	funcs["include"] = func(name string, data interface{}) (string, error) {
		var buf bytes.Buffer
		err := root.ExecuteTemplate(&buf, name, data)
		return buf.String(), err
	}
	funcs["required"] = func(message string, value interface{}) (interface{}, error) {
		if value == nil || value == "" {
			return nil, fmt.Errorf("%s", message)
		}
		return value, nil
	}
	root.Funcs(funcs)

	files, err := filepath.Glob(filepath.Join(chartDir, "templates", "*"))
	if err != nil {
		fail(err)
	}
	sort.Strings(files)
	for _, path := range files {
		text, err := os.ReadFile(path)
		if err != nil {
			fail(err)
		}
		if _, err := root.New(filepath.Base(path)).Parse(string(text)); err != nil {
			fail(err)
		}
	}
	name := chart["name"].(string)
	context := map[string]interface{}{
		"Values": values,
		"Chart": map[string]interface{}{"Name": name, "Version": chart["version"], "AppVersion": chart["appVersion"]},
		"Release": map[string]interface{}{"Name": release, "Namespace": namespace, "Service": "Helm",
			"IsInstall": true, "IsUpgrade": false, "Revision": 1},
	}
	for _, path := range files {
		base := filepath.Base(path)
		if strings.HasPrefix(base, "_") || !strings.HasSuffix(base, ".yaml") {
			continue // partials and notes render nothing themselves
		}
		var buf bytes.Buffer
		if err := root.ExecuteTemplate(&buf, base, context); err != nil {
			fail(err)
		}
		if strings.TrimSpace(buf.String()) == "" {
			continue
		}
		fmt.Printf("---\n# Source: %s/templates/%s\n%s\n", name, base, strings.TrimSpace(buf.String()))
	}
}
