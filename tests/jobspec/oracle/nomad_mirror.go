//go:build nomadmirror

package main

import (
	"fmt"
	"math"

	version "github.com/hashicorp/go-version"

	"lingjunoracle/nomad/semver"
	"lingjunoracle/nomad/structs"
)

// Set by the build helper: the Nomad mirror commit the packages came from.
var nomadCommit = "unknown"

const nomadSkip = ""

func nomadSource() string { return nomadCommit }

func newSemverConstraint(text string) (func(*version.Version) bool, error) {
	c, err := semver.NewConstraint(text)
	if err != nil {
		return nil, err
	}
	return c.Check, nil
}

func attributeAnswer(a *structs.Attribute) answer {
	out := answer{"unit": a.Unit}
	if v, ok := a.GetInt(); ok {
		out["kind"], out["int"] = "int", v
	} else if v, ok := a.GetFloat(); ok {
		out["kind"], out["bits"], out["nan"] = "float", math.Float64bits(v), math.IsNaN(v)
	} else if v, ok := a.GetBool(); ok {
		out["kind"], out["bool"] = "bool", v
	} else if v, ok := a.GetString(); ok {
		out["kind"], out["string"] = "string", v
	}
	return out
}

func parseAttribute(text string) answer {
	return attributeAnswer(structs.ParseAttribute(text))
}

func compareAttributes(a, b string) (ans answer) {
	left, right := structs.ParseAttribute(a), structs.ParseAttribute(b)
	ans = answer{"a": attributeAnswer(left), "b": attributeAnswer(right)}
	defer func() {
		if r := recover(); r != nil {
			ans["panic"] = fmt.Sprint(r)
		}
	}()
	order, ok := left.Compare(right)
	ans["order"], ans["comparable"] = order, ok
	return ans
}

func units() answer {
	table := answer{}
	for name, u := range structs.UnitIndex {
		table[name] = answer{"base": int(u.Base), "multiplier": u.Multiplier, "inverse": u.InverseMultiplier}
	}
	return answer{"units": table}
}
