//! Python's `repr` of the values error messages show.

use super::*;
use serde_json::json;

#[test]
fn strings_are_quoted_and_escaped_as_python_does() {
    assert_eq!(string("x"), "'x'");
    assert_eq!(string("it's"), "\"it's\"");
    assert_eq!(string("say \"hi\""), "'say \"hi\"'");
    assert_eq!(string("both ' and \""), "'both \\' and \"'");
    assert_eq!(string("a\nb\tc\rd\\"), "'a\\nb\\tc\\rd\\\\'");
    assert_eq!(string("\u{0}\u{1f}\u{7f}\u{a0}"), "'\\x00\\x1f\\x7f\\xa0'");
    assert_eq!(string("é€😀"), "'é€😀'");
}

#[test]
fn characters_python_does_not_print_are_escaped_by_their_code() {
    assert_eq!(string("\u{ad}"), "'\\xad'");
    assert_eq!(string("a\u{200b}b"), "'a\\u200bb'");
    assert_eq!(
        string("\u{2028}\u{3000}\u{feff}"),
        "'\\u2028\\u3000\\ufeff'"
    );
    assert_eq!(string("\u{e000}\u{f0000}"), "'\\ue000\\U000f0000'");
}

#[test]
fn floats_are_written_as_python_writes_them() {
    let cases = [
        (1.0, "1.0"),
        (-0.0, "-0.0"),
        (100.0, "100.0"),
        (2.5, "2.5"),
        (1234.5, "1234.5"),
        (0.1, "0.1"),
        (0.0001, "0.0001"),
        (0.00001, "1e-05"),
        (2.5e-7, "2.5e-07"),
        (123456789012345.0, "123456789012345.0"),
        (1e15, "1000000000000000.0"),
        (1e16, "1e+16"),
        (1.5e300, "1.5e+300"),
        (1e39, "1e+39"),
        (5e-324, "5e-324"),
        (f64::NAN, "nan"),
        (f64::INFINITY, "inf"),
        (f64::NEG_INFINITY, "-inf"),
    ];
    for (value, text) in cases {
        assert_eq!(float(value), text, "{value:e}");
    }
}

#[test]
fn json_values_are_written_as_the_repr_of_their_python_form() {
    assert_eq!(value(&json!(null)), "None");
    assert_eq!(
        value(&json!([true, false, 1, -2, 2.5, "a"])),
        "[True, False, 1, -2, 2.5, 'a']"
    );
    assert_eq!(value(&json!(u64::MAX)), "18446744073709551615");
    assert_eq!(
        value(&json!({"k": [1.0], "j": {}})),
        "{'j': {}, 'k': [1.0]}"
    );
}

#[test]
fn a_shown_value_is_cut_at_forty_characters() {
    let forty = "a".repeat(38);
    assert_eq!(shown(&json!(forty)), format!("'{forty}'"));
    let longer = "a".repeat(39);
    assert_eq!(shown(&json!(longer)), format!("'{longer}..."));
}

#[test]
fn each_kind_has_the_python_runtimes_words() {
    let cases = [
        (json!(null), "null"),
        (json!(true), "a boolean"),
        (json!("s"), "a string"),
        (json!(1.5), "a number with a fraction or an exponent"),
        (json!(1), "an integer"),
        (json!(-1), "an integer"),
        (json!([]), "a list"),
        (json!({}), "an object"),
    ];
    for (v, words) in cases {
        assert_eq!(kind(&v), words, "{v}");
    }
}

#[test]
fn shapes_and_their_products_are_written_in_full() {
    assert_eq!(shape(&[]), "[]");
    assert_eq!(shape(&[1, 4]), "[1, 4]");
    assert_eq!(product(&[], 1), "1");
    assert_eq!(product(&[3, 4], 4), "48");
    assert_eq!(product(&[0, usize::MAX], 8), "0");
    assert_eq!(product(&[1_000_000_000], 1), "1000000000");
    assert_eq!(
        product(&[usize::MAX, usize::MAX], 1),
        "340282366920938463426481119284349108225"
    );
    assert_eq!(product(&[1 << 63, 4], 4), "147573952589676412928");
}
