from claimbench import runner


def test_code_stamp_sees_an_edit_in_any_code_folder(tmp_path):
    for folder in runner.CODE_FOLDERS:
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "a.py").write_text("x = 1\n")
    before = runner.code_stamp(tmp_path)
    assert runner.code_stamp(tmp_path) == before
    (tmp_path / "suites" / "a.py").write_text("x = 2\n")
    assert runner.code_stamp(tmp_path) != before
    (tmp_path / "suites" / "a.py").write_text("x = 1\n")
    (tmp_path / "impl" / "b.py").write_text("")
    assert runner.code_stamp(tmp_path) != before
