//! Objects and lists read loosely: the wrong kind is "not that", never serde's error.

use super::*;

fn top(text: &str) -> RequestTop<'_> {
    serde_json::from_str(text).unwrap()
}

#[test]
fn a_top_level_that_is_not_an_object_reads_as_none() {
    for text in [
        "[]",
        "[1, {\"a\": 2}]",
        "1",
        "-1",
        "1.5",
        "\"s\"",
        "true",
        "null",
    ] {
        assert!(top(text).0.is_none(), "{text}");
    }
}

#[test]
fn the_top_levels_fields_stay_raw_and_its_inputs_are_read_as_objects() {
    let RequestTop(Some((fields, inputs))) = top(
        r#"{"id": "r", "parameters": {"a": [1, 2]}, "inputs": [{"name": "x", "data": [[1]]}, 3, []]}"#,
    ) else {
        panic!("an object");
    };
    assert_eq!(fields["id"].get(), "\"r\"");
    assert_eq!(fields["parameters"].get(), "{\"a\": [1, 2]}");
    assert!(!fields.contains_key("inputs"));
    let ListOf(Some(inputs)) = inputs.expect("inputs given") else {
        panic!("a list");
    };
    let kinds: Vec<bool> = inputs.iter().map(|input| input.0.is_some()).collect();
    assert_eq!(kinds, [true, false, false]);
    let first = inputs[0].0.as_ref().unwrap();
    assert_eq!(
        (first["name"].get(), first["data"].get()),
        ("\"x\"", "[[1]]")
    );
}

#[test]
fn inputs_that_are_not_a_list_read_as_none() {
    for text in [
        r#"{"inputs": {"name": "x"}}"#,
        r#"{"inputs": null}"#,
        r#"{"inputs": "x"}"#,
    ] {
        let RequestTop(Some((_, inputs))) = top(text) else {
            panic!("an object");
        };
        assert!(inputs.expect("inputs given").0.is_none(), "{text}");
    }
    let RequestTop(Some((_, inputs))) = top("{}") else {
        panic!("an object");
    };
    assert!(inputs.is_none());
}

#[test]
fn a_key_given_twice_keeps_its_last_value() {
    let RequestTop(Some((fields, inputs))) =
        top(r#"{"id": 1, "inputs": 2, "id": 3, "inputs": [{}]}"#)
    else {
        panic!("an object");
    };
    assert_eq!(fields["id"].get(), "3");
    assert_eq!(inputs.unwrap().0.map(|list| list.len()), Some(1));
}

#[test]
fn json_that_is_not_valid_is_still_serdes_error() {
    assert!(serde_json::from_str::<RequestTop<'_>>(r#"{"inputs": [1,]}"#).is_err());
    assert!(serde_json::from_str::<RequestTop<'_>>(r#"{"a": 1} {}"#).is_err());
}

#[test]
fn a_field_the_decoder_does_not_read_is_still_checked_as_orjson_checks_it() {
    for text in [
        r#"{"extra": 1e400, "inputs": []}"#,
        r#"{"extra": [{"a": ["\ud800"]}], "inputs": []}"#,
        r#"{"inputs": [{"name": "x", "contents": {"n": [-1e999]}}]}"#,
        r#"{"inputs": [3, {"\udc00": 1}]}"#,
    ] {
        assert!(
            serde_json::from_str::<RequestTop<'_>>(text).is_err(),
            "{text}"
        );
    }
    let RequestTop(Some((fields, _))) = top(r#"{"extra": [1, {"a": "b"}], "id": "r"}"#) else {
        panic!("an object");
    };
    assert_eq!(fields.keys().collect::<Vec<_>>(), ["id"]);
}
