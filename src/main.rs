fn main() {
    println!("threadgate");
}
